//! `chimed --generate-docs DIR`: the manual pages chimed(8) and chimed.toml(5) and the shell
//! completions for bash, zsh and fish, made from the flags' own definitions, so that none can fall
//! behind the code. The package build runs it; so do the tests that check the reference.
//!
//! Every flag but `--config` and `--check-config` is also a config-file key of the same name, and
//! chimed.toml(5) is written from that.

use std::io;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{Roff, bold, italic, roman};

use crate::config::cli::Args;

/// Flags that are not config-file keys.
const NOT_KEYS: [&str; 4] = ["config", "check-config", "generate-docs", "help"];

/// Writes chimed.8, chimed.toml.5 and the completions into `dir`.
pub(crate) fn generate(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = Args::command();

    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("System Manager's Manual")
        .source(format!("chime {}", env!("CARGO_PKG_VERSION")))
        .render(&mut page)?;
    page.extend_from_slice(daemon_sections().render().as_bytes());
    std::fs::write(dir.join("chimed.8"), page)?;

    std::fs::write(dir.join("chimed.toml.5"), config_page(&cmd).render())?;

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "chimed", dir)?;
    }
    Ok(())
}

/// What chimed(8) says beyond the flags: signals, files, exit status, where to read more.
fn daemon_sections() -> Roff {
    let mut r = Roff::new();
    r.control("SH", ["SIGNALS"])
        .control("TP", [])
        .text([bold("SIGTERM"), roman(", "), bold("SIGINT")])
        .text([roman(
            "Stop: the workers finish the batch in hand, the totals are logged, chimed exits 0.",
        )])
        .control("TP", [])
        .text([bold("SIGHUP")])
        .text([roman(
            "Reload, keeping what is in force when something fails to load: the NTS certificate \
             and key, the NTS fleet secret, the Roughtime delegation bundle, the access rules from \
             the config file, and the timezone in timezone-offset mode.",
        )])
        .control("SH", ["FILES"])
        .control("TP", [])
        .text([italic("/etc/chimed/chimed.toml")])
        .text([roman(
            "The configuration file chimed's systemd unit passes with --config; see \
             chimed.toml(5).",
        )])
        .control("TP", [])
        .text([italic("/var/lib/chimed")])
        .text([roman(
            "The state directory the systemd unit gives chimed, for --nts-dump-dir's cookie keys.",
        )])
        .control("SH", ["EXIT STATUS"])
        .text([roman(
            "0 after SIGTERM or SIGINT; 2 for a bad flag, config file or key file, with one line \
             naming it; 1 when serving could not start (a port in use, a privilege that cannot \
             be dropped).",
        )])
        .control("SH", ["SEE ALSO"])
        .text([
            bold("chimed.toml"),
            roman("(5), "),
            bold("chime"),
            roman("(1), "),
            bold("chronyd"),
            roman("(8), "),
            bold("chrony.conf"),
            roman("(5)"),
        ]);
    r
}

/// chimed.toml(5): every key, its value and what it does, from the flag of the same name.
fn config_page(cmd: &clap::Command) -> Roff {
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "CHIMED.TOML",
            "5",
            "",
            &format!("chime {}", env!("CARGO_PKG_VERSION")),
            "File Formats Manual",
        ],
    )
    .control("SH", ["NAME"])
    .text([roman("chimed.toml - configuration file of chimed(8)")])
    .control("SH", ["DESCRIPTION"])
    .text([roman(
        "A TOML file of keys at the top level, read at start with chimed -c FILE (the systemd \
         unit uses /etc/chimed/chimed.toml). Every key is optional and has the name and meaning of \
         the chimed(8) flag with the same name; a flag given on the command line wins over the \
         file. An unknown key, or a value of the wrong type, stops chimed with one line naming \
         the key and the file. chimed --check-config prints the settings resolved from both.",
    )])
    .control("SH", ["KEYS"]);
    for arg in cmd.get_arguments() {
        let Some(key) = arg.get_long() else { continue };
        if NOT_KEYS.contains(&key) || arg.is_hide_set() || key == "version" {
            continue;
        }
        let value = match (arg.get_action(), arg.get_value_names()) {
            (clap::ArgAction::SetTrue, _) => "true | false".to_owned(),
            (clap::ArgAction::Append, Some([name, ..])) => {
                format!("[{}, ...]", value_of(name.as_str()))
            }
            (_, Some([name, ..])) => value_of(name.as_str()),
            _ => "VALUE".to_owned(),
        };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        r.control("TP", [])
            .text([bold(key), roman(" = "), italic(value)])
            .text([roman(help)]);
    }
    r.control("SH", ["EXAMPLE"])
        .control("EX", [])
        .text([roman(
            "ipv4-threads = 2\nserver-address = \"127.0.0.1:11123\"\nuser = \"_chimed\"\n\
             nts-certificate = \"/etc/chimed/nts/fullchain.pem\"\n\
             nts-private-key = \"/etc/chimed/nts/privkey.pem\"",
        )])
        .control("EE", [])
        .control("SH", ["SEE ALSO"])
        .text([bold("chimed"), roman("(8), "), bold("chime"), roman("(1)")]);
    r
}

/// How a flag's value is written in TOML, from its value name.
fn value_of(name: &str) -> String {
    match name {
        "N" | "BYTES" | "LOG2" | "SECS" | "SHARE" => format!("{name} (a number)"),
        _ => format!("\"{name}\" (a string)"),
    }
}
