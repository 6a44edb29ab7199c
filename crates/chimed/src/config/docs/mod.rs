//! `chimed --generate-docs DIR`: the manual pages chimed(8) and chimed.toml(5), the shell
//! completions for bash, zsh and fish, and the AsciiDoc references of docs/ (the table of
//! FLAGS.adoc, and CONFIG.adoc), made from the flags' own definitions, so that none can fall
//! behind the code. The package build runs it; so do the tests that check the reference.
//!
//! Every flag but `--config` and `--check-config` sets a config-file key; its clap id is the key's
//! dotted path, and chimed.toml(5) lists each section's keys from that, with the flag's help, its
//! default and what it accepts (`model`).

mod adoc;
mod man;
mod model;
mod text;

use std::io;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::config::schema::Args;

/// Writes chimed.8, chimed.toml.5, the completions, flags-table.adoc and CONFIG.adoc into `dir`.
pub(crate) fn generate(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = Args::command();
    let flags = model::flags(&cmd);

    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("System Manager's Manual")
        .source(format!("chime {}", env!("CARGO_PKG_VERSION")))
        .render(&mut page)?;
    page.extend_from_slice(man::daemon_sections().render().as_bytes());
    std::fs::write(dir.join("chimed.8"), page)?;
    std::fs::write(dir.join("chimed.toml.5"), man::config_page(&flags).render())?;

    std::fs::write(dir.join("flags-table.adoc"), adoc::flag_table(&flags))?;
    std::fs::write(dir.join("CONFIG.adoc"), adoc::config_reference(&flags))?;

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "chimed", dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key says what it accepts and its default, in the schema: a new type of value, or a
    /// flag with neither a default value nor a `[default: …]` in its help, fails here.
    #[test]
    fn every_key_says_what_it_accepts_and_its_default() {
        let flags = model::flags(&Args::command());
        assert!(flags.len() > 60, "{}", flags.len());
        let mut unsaid = Vec::new();
        for flag in flags.iter().filter(|f| f.key.is_some()) {
            if flag.accepts.is_none() {
                unsaid.push(format!(
                    "--{}: no words for its type in values::accepts",
                    flag.long
                ));
            }
            if flag.default.is_none() {
                unsaid.push(format!(
                    "--{}: no default and no [default: …] in its help",
                    flag.long
                ));
            }
        }
        assert!(unsaid.is_empty(), "{}", unsaid.join("\n"));
    }
}
