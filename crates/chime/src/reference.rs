//! docs/CHIME.adoc, the reference of every `chime` subcommand (its arguments, flags, defaults and
//! accepted values), made from the same clap definitions as `--help` and the manual pages, by
//! `chime generate-docs DIR`. A test compares the committed file with it and rewrites it when
//! asked (`UPDATE_REFERENCE=1`).

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command};

/// The help-to-AsciiDoc helpers chimed's references use too.
#[path = "../../chimed/src/config/docs/text.rs"]
mod text;

use text::{cell, inline, split_default};

/// The reference of `cli` (chime's root command) and all its visible subcommands.
pub(crate) fn chime_reference(mut cli: Command) -> String {
    cli.build();
    let mut t = format!(
        "= chime(1): the subcommands\n:toc:\n\n\
         // Generated from chime's flags (crates/chime/src) by chime generate-docs, as the\n\
         // manual pages chime(1) and chime-SUBCOMMAND(1) are: do not edit by hand. After\n\
         // changing a flag, UPDATE_REFERENCE=1 cargo test -p chime --all-features --test\n\
         // reference writes it anew.\n\n\
         `chime`, the operator's tool: {}. Each subcommand's `--help` says the same as its \
         section here, and `-h` in short; `chime --version` prints the version. The package \
         installs the same as the manual pages chime(1) and chime-SUBCOMMAND(1).\n\n",
        lower_first(&about(&cli))
    );
    for sub in visible(&cli) {
        subcommand(&mut t, sub, 2);
    }
    t
}

fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

fn about(cmd: &Command) -> String {
    let about = cmd.get_long_about().or(cmd.get_about());
    inline(&about.map(ToString::to_string).unwrap_or_default())
}

/// One subcommand's section: what it does, its usage, and a table of its arguments and flags;
/// then its own subcommands, a level down.
fn subcommand(t: &mut String, cmd: &Command, level: usize) {
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ");
    // Built, every subcommand knows its whole name (`chime perf ntp`).
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let about = about(cmd);
    let _ = write!(
        t,
        "{} {name}\n\n{}.\n\n",
        "=".repeat(level),
        about.trim_end_matches('.')
    );
    let _ = write!(t, "[source,console]\n----\n{usage}\n----\n\n");
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| shown(a)).collect();
    if !args.is_empty() {
        t.push_str("[cols=\"2,1,5\"]\n|===\n| Argument or flag | Default | Meaning\n\n");
        for arg in args {
            row(t, arg);
        }
        t.push_str("|===\n\n");
    }
    for sub in visible(cmd) {
        subcommand(t, sub, level + 1);
    }
}

fn shown(arg: &Arg) -> bool {
    let builtin = matches!(arg.get_action(), ArgAction::Help | ArgAction::Version);
    !arg.is_hide_set() && !builtin
}

/// One argument or flag: how it is written, its default, and its help with its accepted values.
fn row(t: &mut String, arg: &Arg) {
    let value = arg.get_value_names().and_then(|names| names.first());
    let value = value.map_or_else(|| arg.get_id().as_str().to_uppercase(), ToString::to_string);
    let written = match (arg.is_positional(), arg.get_short(), arg.get_long()) {
        (true, ..) => format!("`{value}`"),
        (false, short, long) => {
            let takes = arg.get_action().takes_values();
            let long = long.map(|l| match takes {
                true => format!("`--{l} {value}`"),
                false => format!("`--{l}`"),
            });
            let short = short.map(|c| format!("`-{c}`"));
            short.into_iter().chain(long).collect::<Vec<_>>().join(", ")
        }
    };
    let help = (arg.get_long_help().or(arg.get_help()))
        .map(ToString::to_string)
        .unwrap_or_default();
    let (mut meaning, said) = split_default(&help);
    let given: Vec<_> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy())
        .collect();
    let default = match (given.is_empty(), said) {
        // A flag without a value is off unless given.
        _ if !arg.get_action().takes_values() => String::new(),
        (false, _) => format!("`{}`", given.join(",")),
        (true, Some(words)) => words,
        (true, None) => String::new(),
    };
    let values = arg.get_possible_values();
    if !values.is_empty() && arg.get_action().takes_values() && !is_switch(arg) {
        let said: Vec<_> = values
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(help) => format!("`{}` ({help})", v.get_name()),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        let _ = write!(meaning, ". One of {}", said.join(", "));
    }
    let _ = writeln!(
        t,
        "| {written} | {} | {}",
        cell(&default),
        cell(&inline(&meaning))
    );
}

/// A flag that is on or off (`--json`), whose possible values are only `true` and `false`.
fn is_switch(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
}

/// `Query, verify …` as it reads after a colon.
fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or(String::new(), |c| c.to_lowercase().chain(chars).collect())
}
