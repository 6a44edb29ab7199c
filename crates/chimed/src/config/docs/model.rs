//! chimed's flags as the references print them, read from the schema's clap command: each flag's
//! key (its clap id), default, accepted values (`values::accepts`, by the type it parses as) and
//! help. The manual pages (`man`) and the AsciiDoc references (`adoc`) are renderings of this.

use clap::{Arg, ArgAction, Command};

use super::text::split_default;
use crate::config::values::{self, Accepts};

/// One flag of chimed.
#[derive(Debug)]
pub(super) struct Flag {
    /// The long name, without the dashes.
    pub(super) long: String,
    pub(super) short: Option<char>,
    /// What follows the flag: ` N`, `[=BOOL]`, or nothing for a flag that takes no value.
    pub(super) takes: String,
    /// The name of its value (`N`, `ADDR:PORT`), if it takes one.
    pub(super) value_name: Option<String>,
    /// The section and key of the config file it sets; `None` for `--config`, `--check-config`.
    pub(super) key: Option<Key>,
    /// Its default: the flag's default value, else what its help says in `[default: …]`.
    pub(super) default: Option<Unset>,
    /// What it accepts, by the type it parses as; `None` if `values::accepts` has no words for
    /// the type (a unit test finds it).
    pub(super) accepts: Option<Accepts>,
    /// Whether it takes several values: an array in the file.
    pub(super) many: Option<Many>,
    /// Its help, without the `[default: …]`.
    pub(super) meaning: String,
}

/// Where a flag's value lives in the config file.
#[derive(Debug)]
pub(super) struct Key {
    /// Its section, dotted (`nts.ratelimit`), and its heading in `--help` (`NTS [nts]`).
    pub(super) section: String,
    pub(super) heading: String,
    pub(super) name: String,
}

/// How a flag takes several values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Many {
    /// Given again for each.
    Repeated,
    /// Comma-separated.
    List,
}

/// A flag's default: what holds when neither the flag nor the file sets it.
#[derive(Debug, PartialEq)]
pub(super) enum Unset {
    /// A value, as it is written on the command line (`0.0.0.0:123`, `false`).
    Value(String),
    /// Words: `off`, `everyone is served`.
    Words(String),
}

/// Every flag of `cmd` that `--help` shows, but `--help` and `--version`, in its order.
pub(super) fn flags(cmd: &Command) -> Vec<Flag> {
    let shown = |arg: &&Arg| {
        let builtin = matches!(arg.get_action(), ArgAction::Help | ArgAction::Version);
        !arg.is_hide_set() && !arg.is_positional() && !builtin
    };
    cmd.get_arguments().filter(shown).map(flag).collect()
}

impl Flag {
    /// How its key's value is written in the file: `N`, `"FILE"`, `true | false`, `["NET", ...]`.
    pub(super) fn toml_value(&self) -> String {
        let name = self.value_name.as_deref().unwrap_or("VALUE");
        let one = match &self.accepts {
            Some(Accepts::Switch) => "true | false".to_owned(),
            Some(Accepts::Text(_) | Accepts::AnyText) | None => format!("\"{name}\""),
            Some(_) => name.to_owned(),
        };
        match self.many {
            Some(_) => format!("[{one}, ...]"),
            None => one,
        }
    }

    /// What the flag accepts: `0 to 1024`, `a string, repeatable`.
    pub(super) fn accepts_on_command_line(&self) -> String {
        let one = self
            .accepts
            .as_ref()
            .map_or("any value".to_owned(), ToString::to_string);
        match self.many {
            Some(Many::Repeated) => format!("{one}; repeatable"),
            Some(Many::List) => format!("{one}; comma-separated"),
            None => one,
        }
    }

    /// What its key accepts, as a sentence without its full stop: `A number, 0 to 1024`, `An
    /// array of strings`.
    pub(super) fn accepts_in_file(&self) -> String {
        let Some(accepts) = &self.accepts else {
            return "Any value".to_owned();
        };
        let kind = accepts.toml_type();
        grouped(&match (self.many, accepts) {
            (_, Accepts::Switch) => "`true` or `false`".to_owned(),
            (Some(_), Accepts::AnyText) => format!("An array of {}s", &kind[2..]),
            (Some(_), _) => format!("An array of {}s, each {accepts}", &kind[2..]),
            (None, Accepts::AnyText) => capitalised(kind),
            (None, _) => format!("{}, {accepts}", capitalised(kind)),
        })
    }
}

/// `text` with every whole number of more than six digits written with TOML's digit separators
/// (`16_777_216`), as the file may give it: easier to read, and the same number.
pub(super) fn grouped(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        let n = digits.len();
        for (i, d) in digits.chars().enumerate() {
            if n > 6 && i > 0 && (n - i).is_multiple_of(3) {
                out.push('_');
            }
            out.push(d);
        }
        digits.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

/// The description of the config file, for chimed.toml(5) in both forms.
pub(super) const FILE_DESCRIPTION: &str = "A TOML file of sections, read at start with chimed -c \
    FILE (the systemd unit uses /etc/chimed/chimed.toml). Every key is optional and has the \
    meaning of the chimed(8) flag named beside it; a flag given on the command line wins over the \
    file, and a switch such as --ratelimit=false turns off the file's true. An unknown key, a \
    value of the wrong type or out of range, or a key of the flat file older versions read, stops \
    chimed with one line naming the file, the line and the key. chimed --check-config prints the \
    settings resolved from both, as a file that gives the same. SIGHUP puts the file's [access] \
    and observe.log-level in force and logs every other key that changed, which takes effect at a \
    restart.";

/// A short example of the file, for chimed.toml(5) in both forms.
pub(super) const FILE_EXAMPLE: &str = "[ntp]\nipv4-threads = 2\n\n\
    [upstream]\nserver-address = \"127.0.0.1:11123\"\n\n\
    [nts]\ncertificate = \"/etc/chimed/nts/fullchain.pem\"\n\
    private-key = \"/etc/chimed/nts/privkey.pem\"\n\n\
    [nts.ratelimit]\nenabled = true";

fn flag(arg: &Arg) -> Flag {
    let help = (arg.get_long_help().or(arg.get_help()))
        .map(ToString::to_string)
        .unwrap_or_default();
    let (meaning, said) = split_default(&help);
    let given: Vec<_> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy())
        .collect();
    let default = match (given.is_empty(), said) {
        (false, _) => Some(Unset::Value(given.join(","))),
        (true, Some(words)) => Some(Unset::Words(words)),
        (true, None) => None,
    };
    let value_name = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(ToString::to_string);
    let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    let takes = match (&value_name, optional) {
        _ if !arg.get_action().takes_values() => String::new(),
        (None, _) => String::new(),
        (Some(name), true) => format!("[={name}]"),
        (Some(name), false) => format!(" {name}"),
    };
    let key = arg
        .get_id()
        .as_str()
        .rsplit_once('.')
        .map(|(section, name)| Key {
            section: section.to_owned(),
            heading: arg.get_help_heading().unwrap_or(section).to_owned(),
            name: name.to_owned(),
        });
    Flag {
        long: arg.get_long().unwrap_or(arg.get_id().as_str()).to_owned(),
        short: arg.get_short(),
        takes,
        value_name,
        key,
        default,
        accepts: values::accepts(arg.get_value_parser()),
        many: match (arg.get_action(), arg.get_value_delimiter()) {
            (ArgAction::Append, None) => Some(Many::Repeated),
            (_, Some(_)) => Some(Many::List),
            _ => None,
        },
        meaning,
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or(String::new(), |c| c.to_uppercase().chain(chars).collect())
}

#[cfg(test)]
mod tests {
    use super::grouped;

    #[test]
    fn long_numbers_are_grouped_as_toml_allows() {
        assert_eq!(grouped("4194304"), "4_194_304");
        assert_eq!(
            grouped("A number, 4096 to 1073741824"),
            "A number, 4096 to 1_073_741_824"
        );
        // Six digits or fewer, and what is not a number, stay as they are.
        assert_eq!(
            grouped("65536 or 127.0.0.1:11123"),
            "65536 or 127.0.0.1:11123"
        );
        assert_eq!(grouped("1048576"), "1_048_576");
    }
}
