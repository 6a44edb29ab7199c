//! The AsciiDoc references in docs/: the table of every flag in FLAGS.adoc (between its markers)
//! and CONFIG.adoc, chimed.toml(5) as the repository shows it. The tests compare the committed
//! files with these and rewrite them when asked (`UPDATE_REFERENCE=1`).

use std::fmt::Write as _;

use super::model::{FILE_DESCRIPTION, FILE_EXAMPLE, Flag, Unset, grouped};
use super::text::{cell, inline};

/// The first and last lines of the generated table in docs/FLAGS.adoc.
const TABLE_BEGINS: &str = "// Generated from the schema by chimed --generate-docs: \
                                       do not edit by hand (see the foot of the table).";
const TABLE_ENDS: &str = "// The table above is generated: after changing a flag, \
                                     UPDATE_REFERENCE=1 cargo test -p chimed --test reference \
                                     writes it anew.";

/// The table of every flag: its config key, default, accepted values and meaning.
pub(super) fn flag_table(flags: &[Flag]) -> String {
    let mut t = format!("{TABLE_BEGINS}\n[cols=\"3,2,1,2,6\"]\n|===\n");
    t.push_str("| Flag | Key | Default | Accepts | Meaning\n\n");
    for flag in flags {
        let key = match &flag.key {
            Some(key) => format!("`[{}]` `{}`", key.section, key.name),
            None => String::new(),
        };
        let flag_names = match flag.short {
            Some(c) => format!("`-{c}`, `--{}{}`", flag.long, flag.takes),
            None => format!("`--{}{}`", flag.long, flag.takes),
        };
        let _ = writeln!(
            t,
            "| {flag_names} | {key} | {} | {} | {}",
            cell(&default(flag)),
            cell(&inline(&flag.accepts_on_command_line())),
            cell(&inline(&flag.meaning)),
        );
    }
    t.push_str("|===\n");
    t.push_str(TABLE_ENDS);
    t.push('\n');
    t
}

/// chimed.toml(5): every section's keys, each with its value, what it accepts, its default, its
/// meaning and its flag; the description and example are the manual page's.
pub(super) fn config_reference(flags: &[Flag]) -> String {
    let mut t = String::from(
        "= chimed.toml(5): chimed's configuration file\n:toc:\n\n\
         // Generated from the schema (crates/chimed/src/config/schema.rs) by chimed \
         --generate-docs, as\n\
         // the manual page chimed.toml(5) is: do not edit by hand. After changing a key,\n\
         // UPDATE_REFERENCE=1 cargo test -p chimed --test reference writes it anew.\n\n",
    );
    t.push_str(&inline(FILE_DESCRIPTION));
    t.push_str(
        "\n\nEach key below is written as in the file, with the flag that sets it; \
         link:FLAGS.adoc[FLAGS.adoc] has the same in one table, by flag, and \
         `configs/chimed.toml` is a complete example.\n\n",
    );
    let mut section = "";
    for flag in flags {
        let Some(key) = &flag.key else { continue };
        if key.section != section {
            section = &key.section;
            let _ = write!(
                t,
                "== {}\n\n",
                key.heading.replace('[', "`[").replace(']', "]`")
            );
        }
        let default = match &flag.default {
            Some(Unset::Value(v)) => format!("; default `{}`", grouped(v)),
            Some(Unset::Words(w)) => format!("; default: {w}"),
            None => String::new(),
        };
        let flag_names = match flag.short {
            Some(c) => format!("`--{}`, `-{c}`", flag.long),
            None => format!("`--{}`", flag.long),
        };
        let _ = write!(
            t,
            "`{} = {}`::\n{}. +\n{}{default}. Flag: {flag_names}.\n\n",
            key.name,
            flag.toml_value(),
            inline(flag.meaning.trim_end_matches('.')),
            inline(&flag.accepts_in_file()),
        );
    }
    let _ = write!(
        t,
        "== Example\n\n[source,toml]\n----\n{FILE_EXAMPLE}\n----\n\n\
         == See also\n\nchimed(8) (link:FLAGS.adoc[FLAGS.adoc]), chime(1) \
         (link:CHIME.adoc[CHIME.adoc]).\n"
    );
    t
}

fn default(flag: &Flag) -> String {
    match &flag.default {
        Some(Unset::Value(v)) => format!("`{v}`"),
        Some(Unset::Words(w)) => w.clone(),
        None => String::new(),
    }
}
