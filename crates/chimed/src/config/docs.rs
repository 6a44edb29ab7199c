//! `chimed --generate-docs DIR`: the manual pages chimed(8) and chimed.toml(5) and the shell
//! completions for bash, zsh and fish, made from the flags' own definitions, so that none can fall
//! behind the code. The package build runs it; so do the tests that check the reference.
//!
//! Every flag but `--config` and `--check-config` sets a config-file key; its clap id is the key's
//! dotted path, and chimed.toml(5) lists each section's keys from that, with the flag's help.

use std::io;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{Roff, bold, italic, roman};

use crate::config::schema::Args;

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
             and key, the NTS fleet secret, the Roughtime delegation bundle, the access rules and \
             the log level from the config file, and the timezone in timezone-offset mode.",
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

/// chimed.toml(5): every section's keys, each with its value, what it does and its flag.
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
        "A TOML file of sections, read at start with chimed -c FILE (the systemd unit uses \
         /etc/chimed/chimed.toml). Every key is optional and has the meaning of the chimed(8) \
         flag named beside it; a flag given on the command line wins over the file, and a switch \
         such as --ratelimit=false turns off the file's true. An unknown key, a value of the \
         wrong type or out of range, or a key of the flat file older versions read, stops chimed \
         with one line naming the file, the line and the key. chimed --check-config prints the \
         settings resolved from both, as a file that gives the same. SIGHUP puts the file's [access] and observe.log-level in \
         force and logs every other key that changed, which takes effect at a restart.",
    )]);
    let mut section = "";
    for arg in cmd.get_arguments() {
        let Some((in_section, key)) = arg.get_id().as_str().rsplit_once('.') else {
            continue;
        };
        if in_section != section {
            section = in_section;
            r.control("SH", [format!("[{section}]").as_str()]);
        }
        let value = match (arg.get_action(), arg.get_value_names()) {
            (_, Some([name, ..])) if name == "BOOL" => "true | false".to_owned(),
            (clap::ArgAction::Append, Some([name, ..])) => {
                format!("[{}, ...]", value_of(name.as_str()))
            }
            (_, Some([name, ..])) if name == "LIST" => "[N, ...]".to_owned(),
            (_, Some([name, ..])) => value_of(name.as_str()),
            _ => "VALUE".to_owned(),
        };
        let mut help = (arg.get_long_help().or(arg.get_help()))
            .map(ToString::to_string)
            .unwrap_or_default();
        if let [default] = arg.get_default_values() {
            help.push_str(&format!(" [default: {}]", default.to_string_lossy()));
        }
        let long = arg.get_long().unwrap_or(key);
        let flag = match arg.get_short() {
            Some(c) => format!("Flag: --{long}, -{c}"),
            None => format!("Flag: --{long}"),
        };
        r.control("TP", [])
            .text([bold(key), roman(" = "), italic(value)])
            .text([roman(help)])
            .control("br", [])
            .text([roman(flag)]);
    }
    r.control("SH", ["EXAMPLE"])
        .control("EX", [])
        .text([roman(
            "[ntp]\nipv4-threads = 2\n\n[upstream]\nserver-address = \"127.0.0.1:11123\"\n\n\
             [nts]\ncertificate = \"/etc/chimed/nts/fullchain.pem\"\n\
             private-key = \"/etc/chimed/nts/privkey.pem\"\n\n[nts.ratelimit]\nenabled = true",
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
