//! docs/CHIME.adoc, the reference of every `chime` subcommand, is what `chime generate-docs` makes
//! from chime's flags, byte for byte; `UPDATE_REFERENCE=1` writes it anew, as an expect test does.
//!
//! `chime keygen --mldsa` exists only in a build with the `mldsa` feature, so the committed file
//! is that build's (`--all-features`, as scripts/test runs); a build without it compares every
//! section but keygen's.

use std::path::Path;
use std::process::Command;

/// How to write the reference anew, as its failure says.
const UPDATE: &str = "UPDATE_REFERENCE=1 cargo test -p chime --all-features --test reference";

/// The section of the subcommand whose flags differ by feature.
const BY_FEATURE: &str = "== chime keygen\n";

#[test]
fn the_subcommand_reference_is_chimes_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chime"))
        .arg("generate-docs")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "chime generate-docs: {out:?}");
    let generated = std::fs::read_to_string(dir.path().join("CHIME.adoc")).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CHIME.adoc");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let every_feature = cfg!(feature = "mldsa");
    let (ours, theirs) = match every_feature {
        true => (committed.clone(), generated.clone()),
        false => (without_keygen(&committed), without_keygen(&generated)),
    };
    if ours == theirs {
        return;
    }
    if std::env::var_os("UPDATE_REFERENCE").is_some_and(|v| v == "1") {
        assert!(
            every_feature,
            "write docs/CHIME.adoc from a build with every feature: {UPDATE}"
        );
        std::fs::write(&path, generated).unwrap();
        eprintln!("docs/CHIME.adoc: written anew");
        return;
    }
    let line = (ours.lines().zip(theirs.lines()))
        .position(|(a, b)| a != b)
        .unwrap_or(ours.lines().count().min(theirs.lines().count()));
    let at = |text: &str| text.lines().nth(line).unwrap_or("(the end)").to_owned();
    panic!(
        "docs/CHIME.adoc is not what chime generates from its flags{}: line {}\n  committed: {}\n  \
         generated: {}\nWrite it anew with {UPDATE}, and commit it",
        if every_feature {
            ""
        } else {
            " (keygen's section aside)"
        },
        line + 1,
        at(&ours),
        at(&theirs),
    );
}

/// The reference without keygen's section, which a build without `mldsa` writes differently.
fn without_keygen(text: &str) -> String {
    let Some(start) = text.find(BY_FEATURE) else {
        return text.to_owned();
    };
    let rest = &text[start + BY_FEATURE.len()..];
    let end = rest
        .find("\n== ")
        .map_or(text.len(), |n| start + BY_FEATURE.len() + n + 1);
    format!("{}{}", &text[..start], &text[end..])
}
