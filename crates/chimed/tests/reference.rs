//! The reference keeps up with the code. The table of flags in docs/FLAGS.adoc and the config
//! reference docs/CONFIG.adoc are what `chimed --generate-docs` makes from the schema, byte for
//! byte (`UPDATE_REFERENCE=1` writes them anew, as an expect test does); every flag `chimed
//! --help` lists is in the manual page chimed(8) and, under the section and key it sets, in
//! chimed.toml(5) and the example config (configs/chimed.toml); every `chime` subcommand has its
//! manual page naming each of its flags; the completions are written for bash, zsh and fish; and
//! docs/METRICS.adoc names every metric family chimed serves.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::run;

/// The long flags in a `--help` text: the first `--name` of each option line.
fn long_flags(help: &str) -> Vec<String> {
    let mut flags = Vec::new();
    for line in help.lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        if let Some(at) = line.find("--") {
            let name: String = line[at + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !name.is_empty() && name != "help" && name != "version" {
                flags.push(name);
            }
        }
    }
    flags
}

fn help_of(bin: &str, args: &[&str]) -> String {
    let out = run(Command::new(common::workspace_bin(bin))
        .args(args)
        .arg("--help"));
    assert!(out.status.success(), "{bin} {args:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// How to write the generated references anew, as every failure about them says.
const UPDATE: &str = "UPDATE_REFERENCE=1 cargo test -p chimed --test reference";

/// `path` (from the repository's root) holds `expected`, or, with `UPDATE_REFERENCE=1`, is made
/// to; else the first line that differs, and how to write it anew.
fn expect_file(path: &str, expected: &str) -> Result<(), String> {
    let committed = std::fs::read_to_string(repo_root().join(path)).unwrap_or_default();
    if committed == expected {
        return Ok(());
    }
    if std::env::var_os("UPDATE_REFERENCE").is_some_and(|v| v == "1") {
        std::fs::write(repo_root().join(path), expected).unwrap();
        eprintln!("{path}: written anew");
        return Ok(());
    }
    let line = (committed.lines().zip(expected.lines()))
        .position(|(a, b)| a != b)
        .unwrap_or(committed.lines().count().min(expected.lines().count()));
    let at = |text: &str| text.lines().nth(line).unwrap_or("(the end)").to_owned();
    Err(format!(
        "{path} is not what the code generates: line {}\n  committed: {}\n  generated: {}\n\
         Write it anew with {UPDATE}, and commit it",
        line + 1,
        at(&committed),
        at(expected),
    ))
}

/// Every Rust source under `dir`, one after another.
fn sources(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.push_str(&sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            all.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    all
}

/// `bin --generate-docs DIR` (chimed) or `bin generate-docs DIR` (chime), into a new directory.
fn generated(bin: &str, args: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(common::workspace_bin(bin))
        .args(args)
        .arg(dir.path()));
    assert!(out.status.success(), "{bin} {args:?}: {out:?}");
    dir
}

/// roff writes a dash in text as `\-`.
fn in_roff(page: &str, text: &str) -> bool {
    page.contains(&text.replace('-', "\\-"))
}

/// chimed.toml(5)'s keys, by the flag each names: `--flag` → `[section] key`.
fn keys_by_flag(page: &str) -> Vec<(String, String)> {
    let page = page.replace("\\-", "-");
    let (mut section, mut key, mut keys) = ("", "", Vec::new());
    for line in page.lines() {
        if let Some(s) = line.strip_prefix(".SH ") {
            section = s.trim_matches('"');
        } else if let Some(k) = line.strip_prefix("\\fB") {
            key = k.split("\\fR").next().unwrap_or("");
        } else if let Some(flag) = line.strip_prefix("Flag: ") {
            let flag = flag.split(',').next().unwrap_or("");
            keys.push((flag.to_owned(), format!("{section} {key}")));
        }
    }
    keys
}

/// The example config's keys, set or commented out: `[section] key`.
fn example_keys(text: &str) -> Vec<String> {
    let (mut section, mut keys) = ("", Vec::new());
    for line in text.lines() {
        if line.starts_with('[') {
            section = line;
        } else if let Some((key, _)) = line.trim_start_matches("# ").split_once(" = ") {
            keys.push(format!("{section} {key}"));
        }
    }
    keys
}

/// The flag table of docs/FLAGS.adoc (between its first and last lines as generated; the prose
/// around it is written by hand) and docs/CONFIG.adoc are the schema's, as chimed generates them.
#[test]
fn the_flag_table_and_the_config_reference_are_the_schemas() {
    let docs = generated("chimed", &["--generate-docs"]);
    let table = std::fs::read_to_string(docs.path().join("flags-table.adoc")).unwrap();
    let config = std::fs::read_to_string(docs.path().join("CONFIG.adoc")).unwrap();
    let flags_doc = repo_file("docs/FLAGS.adoc");
    let (first, last) = (table.lines().next().unwrap(), table.lines().last().unwrap());
    let (Some(begins), Some(ends)) = (flags_doc.find(first), flags_doc.find(last)) else {
        panic!(
            "docs/FLAGS.adoc has lost its generated table's first line\n{first}\nor last\n{last}"
        );
    };
    let after = &flags_doc[ends + last.len()..];
    let after = after.strip_prefix('\n').unwrap_or(after);
    let expected = format!("{}{table}{after}", &flags_doc[..begins]);
    let results = [
        expect_file("docs/FLAGS.adoc", &expected),
        expect_file("docs/CONFIG.adoc", &config),
    ];
    let wrong: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// Every flag is in chimed(8), and every flag that sets a key is in chimed.toml(5) and, set or
/// commented out, in the example config. (docs/FLAGS.adoc is the generator's own, above.)
#[test]
fn every_chimed_flag_is_in_the_manual_and_the_example_config() {
    let flags = long_flags(&help_of("chimed", &[]));
    assert!(
        flags.len() > 60,
        "too few flags read from --help: {flags:?}"
    );
    let example = example_keys(&repo_file("configs/chimed.toml"));
    let docs = generated("chimed", &["--generate-docs"]);
    let man = std::fs::read_to_string(docs.path().join("chimed.8")).unwrap();
    let config_man = std::fs::read_to_string(docs.path().join("chimed.toml.5")).unwrap();
    let keys = keys_by_flag(&config_man);
    let mut missing = Vec::new();
    for flag in &flags {
        if !in_roff(&man, &format!("--{flag}")) {
            missing.push(format!("--{flag}: not in chimed(8)"));
        }
        if flag == "config" || flag == "check-config" {
            continue;
        }
        let Some((_, key)) = keys.iter().find(|(f, _)| *f == format!("--{flag}")) else {
            missing.push(format!("--{flag}: no key in chimed.toml(5)"));
            continue;
        };
        if !example.contains(key) {
            missing.push(format!("--{flag}: {key} not in configs/chimed.toml"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(
        keys.contains(&("--nts-ke-threads".into(), "[nts] ke-threads".into())),
        "{keys:?}"
    );
    for file in ["chimed.bash", "_chimed", "chimed.fish"] {
        let text = std::fs::read_to_string(docs.path().join(file)).unwrap();
        assert!(text.contains("nts-ke-threads"), "{file}");
    }
    // A flag or a key that is not there is noticed: the checks can fail.
    assert!(!in_roff(&man, "--no-such-flag"));
    assert!(!example.contains(&"[ntp] no-such-key".to_owned()));
}

#[test]
fn every_chime_subcommand_has_a_manual_page_naming_its_flags() {
    let docs = generated("chime", &["generate-docs"]);
    let subcommands: [&[&str]; 9] = [
        &["ntp"],
        &["roughtime"],
        &["keygen"],
        &["delegate"],
        &["nts-fleet-key"],
        &["perf", "ntp"],
        &["perf", "roughtime"],
        &["perf", "nts-ke"],
        &["perf"],
    ];
    let mut missing = Vec::new();
    for sub in subcommands {
        let page_name = format!("chime-{}.1", sub.join("-"));
        let Ok(page) = std::fs::read_to_string(docs.path().join(&page_name)) else {
            missing.push(format!("{page_name}: not written"));
            continue;
        };
        for flag in long_flags(&help_of("chime", sub)) {
            if !in_roff(&page, &format!("--{flag}")) {
                missing.push(format!(
                    "chime {}: --{flag} not in {page_name}",
                    sub.join(" ")
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(docs.path().join("chime.1").exists());
    // The generator itself is no part of the manual.
    assert!(!docs.path().join("chime-generate-docs.1").exists());
    for file in ["chime.bash", "_chime", "chime.fish"] {
        let text = std::fs::read_to_string(docs.path().join(file)).unwrap();
        assert!(text.contains("nts-sessions"), "{file}");
    }
}

/// Every metric family chimed serves: every `"chimed_…"` name written in its sources (each
/// service's collector is beside the service).
fn metric_families() -> Vec<String> {
    let source = sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut families: Vec<String> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("chimed_")
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect();
    families.sort_unstable();
    families.dedup();
    assert!(families.len() >= 30, "too few families read: {families:?}");
    families
}

/// docs/METRICS.adoc names every metric family chimed serves (every `"chimed_…"` name written in
/// the sources: each service's collector is beside the service) and every reason
/// `chimed_requests_dropped_total` can carry.
#[test]
fn every_metric_and_drop_reason_is_in_the_metrics_reference() {
    let doc = repo_file("docs/METRICS.adoc");
    let families = metric_families();
    let mut reasons: Vec<String> = chime_ntp::DropReason::LABELS
        .iter()
        .map(|r| (*r).to_owned())
        .chain(
            chime_roughtime::DropReason::ALL
                .iter()
                .map(|r| r.label().to_owned()),
        )
        .collect();
    // The reasons the daemon adds: `(Self::X, "reason"),` beside its own reason in the NTP
    // worker and in Roughtime's shared state.
    for worker in ["ntp/worker.rs", "roughtime/state.rs"] {
        let text = repo_file(&format!("crates/chimed/src/{worker}"));
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("(Self::"))
        {
            if let Some(r) = line.split('"').nth(1) {
                reasons.push(r.to_owned());
            }
        }
    }
    for own in ["nts_invalid", "upstream_unsynchronised"] {
        assert!(reasons.contains(&own.to_owned()), "{own}: {reasons:?}");
    }
    let missing: Vec<String> = families
        .into_iter()
        .chain(reasons)
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/METRICS.adoc: {missing:?}");
}
