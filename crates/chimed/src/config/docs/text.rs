//! AsciiDoc from clap's help texts, for the generated references: chimed's (docs/FLAGS.adoc's
//! table and docs/CONFIG.adoc) and chime's (docs/CHIME.adoc). chime's crates/chime/src/reference.rs
//! includes this file by its path, as the tests share tests/common, so that both binaries write
//! help the same way.

use std::fmt::Write as _;

/// A help text without its `[default: …]`, and what that said.
pub(super) fn split_default(help: &str) -> (String, Option<String>) {
    let Some(at) = help.find("[default: ") else {
        return (help.to_owned(), None);
    };
    let rest = &help[at + "[default: ".len()..];
    let Some(end) = rest.find(']') else {
        return (help.to_owned(), None);
    };
    let before = help[..at].trim_end();
    let after = &rest[end + 1..];
    (format!("{before}{after}"), Some(rest[..end].to_owned()))
}

/// A table cell's text: a `|` would end the cell.
pub(super) fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Help text as AsciiDoc: each `--flag` (and `--flag=VALUE`) outside backticks put in them, so
/// that it reads as code, as the flags written by hand do.
pub(super) fn inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, part) in text.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(part);
            continue;
        }
        let mut rest = part;
        while let Some(at) = rest.find("--") {
            let starts = rest[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric() && c != '-');
            let name_len = rest[at + 2..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '='))
                .unwrap_or(rest.len() - at - 2);
            let token = rest[at..at + 2 + name_len].trim_end_matches(['-', '=']);
            let is_flag = token.len() > 2 && token.as_bytes()[2].is_ascii_lowercase();
            if starts && is_flag {
                out.push_str(&rest[..at]);
                let _ = write!(out, "`{token}`");
                rest = &rest[at + token.len()..];
            } else {
                out.push_str(&rest[..at + 2]);
                rest = &rest[at + 2..];
            }
        }
        out.push_str(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::inline;

    #[test]
    fn flags_in_help_are_put_in_backticks() {
        assert_eq!(
            inline("--ntpv5=false turns off `v5 = true`; -4 0, --nts-dump-dir."),
            "`--ntpv5=false` turns off `v5 = true`; -4 0, `--nts-dump-dir`."
        );
        assert_eq!(inline("`--allow` and a--b -- c"), "`--allow` and a--b -- c");
    }
}
