//! The reference keeps up with the code. The table of flags in docs/FLAGS.adoc and the config
//! reference docs/CONFIG.adoc are what `chimed --generate-docs` makes from the schema, byte for
//! byte (`UPDATE_REFERENCE=1` writes them anew, as an expect test does); every flag `chimed
//! --help` lists is in the manual page chimed(8) and, under the section and key it sets, in
//! chimed.toml(5) and the example config (configs/chimed.toml); every `chime` subcommand has its
//! manual page naming each of its flags; the completions are written for bash, zsh and fish;
//! docs/METRICS.adoc names every metric family chimed serves; and every `--flag` and `chimed_…`
//! metric the README and docs/ name exists.

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

/// Long flags of other programs that the docs name, each with the program's name. A flag of
/// chimed, of a chime subcommand or of one of the repository's scripts needs no entry.
const OTHER_PROGRAMS_FLAGS: &[(&str, &str)] = &[
    ("--all-features", "cargo"),
    ("--all-targets", "cargo"),
    ("--bench", "cargo"),
    ("--bins", "cargo"),
    ("--features", "cargo"),
    ("--lib", "cargo"),
    ("--locked", "cargo"),
    ("--no-fail-fast", "cargo"),
    ("--release", "cargo"),
    ("--test", "cargo"),
    ("--workspace", "cargo"),
    ("--check", "cargo-fmt"),
    ("--measurement-time", "criterion"),
    ("--warm-up-time", "criterion"),
    ("--argjson", "jq"),
    ("--now", "systemctl"),
    ("--system", "sysctl/useradd"),
    ("--no-create-home", "useradd"),
    ("--shell", "useradd"),
    // `chime keygen --mldsa` is a flag of a chime built with the `mldsa` feature only.
    ("--mldsa", "chime-mldsa"),
];

/// Every `--flag` the README and docs/ name in code (between backticks, or in a listing or
/// literal block) is a flag of chimed, of some chime subcommand, of one of the repository's
/// scripts, or of another program named in `OTHER_PROGRAMS_FLAGS`; and every `chimed_…` name is
/// a metric chimed serves: a family, a counter's without `_total` (its `# TYPE` line), an info
/// metric's with `_info`, or a histogram's series. One line per offender, file:line.
#[test]
fn every_flag_and_metric_the_docs_name_exists() {
    let flags = known_flags();
    assert!(flags.len() > 150, "too few flags read: {}", flags.len());
    let metrics = metric_names();
    let tests = test_names();
    let mut docs = vec![repo_root().join("README.adoc")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "adoc"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    let mut unknown = Vec::new();
    for path in &docs {
        let name = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).unwrap();
        for (line, flag) in code_flags(&text) {
            if !flags.contains(&flag) && !OTHER_PROGRAMS_FLAGS.iter().any(|(f, _)| *f == flag) {
                unknown.push(format!("{name}:{line}: {flag}: no program's flag"));
            }
        }
        for (line, metric) in metric_mentions(&text) {
            let exists = match metric.strip_suffix('*') {
                Some(prefix) => metrics.iter().any(|m| m.starts_with(prefix)),
                None => metrics.contains(&metric) || tests.contains(&metric),
            };
            if !exists {
                unknown.push(format!(
                    "{name}:{line}: {metric}: not a metric chimed serves"
                ));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the docs name flags or metrics that do not exist (a flag of another program goes in \
         OTHER_PROGRAMS_FLAGS, with the program):\n{}",
        unknown.join("\n")
    );
}

/// The long flags of chimed, of chime and each of its subcommands (from their `--help`), and of
/// the repository's scripts (their `case` arms, `== --flag` tests and argparse arguments).
fn known_flags() -> Vec<String> {
    let mut flags: Vec<String> = long_flags(&help_of("chimed", &[]));
    let mut commands = vec![Vec::<String>::new()];
    while let Some(command) = commands.pop() {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let help = help_of("chime", &args);
        flags.extend(long_flags(&help));
        for sub in subcommands(&help) {
            commands.push(command.iter().cloned().chain([sub]).collect());
        }
    }
    flags.extend(["help".to_owned(), "version".to_owned()]);
    let mut known: Vec<String> = flags.into_iter().map(|f| format!("--{f}")).collect();
    for dir in ["scripts", "ntpperf-results/scripts"] {
        for entry in std::fs::read_dir(repo_root().join(dir)).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            known.extend(script_flags(&text));
        }
    }
    known.sort();
    known.dedup();
    known
}

/// The subcommands a `--help` lists under `Commands:`, but `help`.
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, commands)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    let listed = commands.lines().take_while(|l| l.starts_with("  "));
    let names = listed.filter_map(|l| l.split_whitespace().next());
    names.filter(|n| *n != "help").map(str::to_owned).collect()
}

/// The flags a shell or Python script takes: `--a | --b)` case arms, `== --flag` tests and
/// `add_argument("--flag"`.
fn script_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let arm = line.split_once(')').map(|(pattern, _)| pattern);
        let arm = arm.filter(|p| p.starts_with("--") && p.split('|').all(|f| is_flag(f.trim())));
        flags.extend(
            arm.into_iter()
                .flat_map(|p| p.split('|').map(|f| f.trim().to_owned())),
        );
        for marker in ["== --", "add_argument(\"--"] {
            for (at, _) in line.match_indices(marker) {
                let name = flag_at(&line[at + marker.len() - 2..]);
                flags.extend(name);
            }
        }
    }
    flags
}

fn is_flag(word: &str) -> bool {
    word.strip_prefix("--").is_some_and(|name| {
        name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    })
}

/// The `--flag` at the start of `text`, without a `=VALUE` or a trailing `-`.
fn flag_at(text: &str) -> Option<String> {
    let end = text[2..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .map_or(text.len(), |n| n + 2);
    let flag = text[..end].trim_end_matches('-');
    is_flag(flag).then(|| flag.to_owned())
}

/// Each `--flag` written as code, by line: between backticks (which may span lines, within a
/// paragraph) or in a listing (`----`) or literal (`....`) block. Comments (`//`, and `////`
/// blocks) are skipped.
fn code_flags(text: &str) -> Vec<(usize, String)> {
    /// A line of four or more of one of these opens a block, and the same line closes it.
    const DELIMITERS: [u8; 3] = [b'-', b'.', b'/'];
    let mut found = Vec::new();
    let (mut block, mut in_backticks) = (None::<&str>, false);
    for (n, line) in text.lines().enumerate() {
        let delimiter = line.len() >= 4 && DELIMITERS.iter().any(|d| line.bytes().all(|b| b == *d));
        if delimiter {
            block = if block == Some(line) {
                None
            } else {
                block.or(Some(line))
            };
            in_backticks = false;
            continue;
        }
        let comment = block.is_some_and(|b| b.starts_with('/'));
        if comment || block.is_none() && (line.trim().is_empty() || line.starts_with("//")) {
            in_backticks = false;
            continue;
        }
        let mut previous = ' ';
        for (at, c) in line.char_indices() {
            if c == '`' {
                in_backticks = !in_backticks;
            } else if c == '-'
                && (block.is_some() || in_backticks)
                && !(previous.is_alphanumeric() || previous == '-')
                && line[at..].starts_with("--")
            {
                found.extend(flag_at(&line[at..]).map(|flag| (n + 1, flag)));
            }
            previous = c;
        }
    }
    found
}

/// Every name of a metric chimed serves, as a scrape or an alert rule may write it.
fn metric_names() -> Vec<String> {
    let mut names = Vec::new();
    for family in metric_families() {
        if let Some(counter) = family.strip_suffix("_total") {
            names.push(counter.to_owned());
        }
        for suffix in ["", "_info", "_bucket", "_sum", "_count", "_created"] {
            names.push(format!("{family}{suffix}"));
        }
    }
    names
}

/// Each `chimed_…` name in the text, by line; `chimed_ntp_*` stands for every name it begins.
fn metric_mentions(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("chimed_") {
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            match line[at + name.len()..].starts_with('*') {
                true => found.push((n + 1, format!("{name}*"))),
                false => found.push((n + 1, name.trim_end_matches('_').to_owned())),
            }
        }
    }
    found
}

/// The tests named `chimed_…` (a doc may name a test by its function), from every crate's tests.
fn test_names() -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(repo_root().join("crates")).unwrap() {
        let tests = entry.unwrap().path().join("tests");
        if !tests.is_dir() {
            continue;
        }
        let text = sources(&tests);
        for (at, _) in text.match_indices("fn chimed_") {
            let name = text[at + 3..].split('(').next().unwrap_or("");
            names.push(name.to_owned());
        }
    }
    names
}
