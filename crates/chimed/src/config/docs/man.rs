//! The manual pages' own parts: chimed(8) beyond the flags clap_mangen writes, and chimed.toml(5)
//! whole, from the flags (`model`).

use clap_mangen::roff::{Roff, bold, italic, roman};

use super::model::{FILE_DESCRIPTION, FILE_EXAMPLE, Flag, Unset, grouped};

/// What chimed(8) says beyond the flags: signals, files, exit status, where to read more.
pub(super) fn daemon_sections() -> Roff {
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

/// chimed.toml(5): every section's keys, each with its value, what it does, what it accepts, its
/// default and its flag.
pub(super) fn config_page(flags: &[Flag]) -> Roff {
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
    .text([roman(FILE_DESCRIPTION)]);
    let mut section = "";
    for flag in flags {
        let Some(key) = &flag.key else { continue };
        if key.section != section {
            section = &key.section;
            r.control("SH", [format!("[{section}]").as_str()]);
        }
        let default = match &flag.default {
            Some(Unset::Value(v)) => format!("; default: {}", grouped(v)),
            Some(Unset::Words(w)) => format!("; default: {w}"),
            None => String::new(),
        };
        let flag_names = match flag.short {
            Some(c) => format!("Flag: --{}, -{c}", flag.long),
            None => format!("Flag: --{}", flag.long),
        };
        r.control("TP", [])
            .text([bold(&key.name), roman(" = "), italic(flag.toml_value())])
            .text([roman(format!("{}.", flag.meaning.trim_end_matches('.')))])
            .control("br", [])
            .text([roman(format!("{}{default}.", flag.accepts_in_file()))])
            .control("br", [])
            .text([roman(flag_names)]);
    }
    r.control("SH", ["EXAMPLE"])
        .control("EX", [])
        .text([roman(FILE_EXAMPLE)])
        .control("EE", [])
        .control("SH", ["SEE ALSO"])
        .text([bold("chimed"), roman("(8), "), bold("chime"), roman("(1)")]);
    r
}
