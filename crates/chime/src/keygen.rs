//! Key files: `chime keygen FILE`, a new Roughtime long-term key, and `chime nts-fleet-key FILE`,
//! a new NTS fleet secret. Both files are created with mode 0600 and never overwritten: losing a
//! long-term key to a typo would orphan every client configured with its public key, and losing
//! a fleet secret every NTS client's cookies.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_ntp::nts::{FleetSecret, encode_fleet_file};
use chime_roughtime::{LongTermKey, encode_key_file};
use zeroize::Zeroizing;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where to write the key; must not exist yet
    file: PathBuf,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    create_secret_file(&args.file, encode_key_file(&seed).as_bytes())?;
    let public = LongTermKey::from_seed(&seed).public_key();
    println!("public key (base64): {}", BASE64.encode(public));
    println!(
        "public key (hex): {}",
        public
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    Ok(())
}

#[derive(Debug, clap::Args)]
pub(crate) struct FleetArgs {
    /// Where to write the fleet secret; must not exist yet
    file: PathBuf,
}

/// `chime nts-fleet-key FILE`: 32 random bytes that every member of one fleet holds.
pub(crate) fn run_fleet(args: &FleetArgs) -> Result<()> {
    let secret = FleetSecret(rand::random());
    create_secret_file(&args.file, encode_fleet_file(&secret).as_bytes())?;
    println!(
        "NTS fleet secret written to {}: give every member of the fleet this same file \
         (chimed --nts-fleet-key)",
        args.file.display()
    );
    Ok(())
}

/// Writes `contents` to a new file at `path`, mode 0600; an existing file is an error, never
/// overwritten.
fn create_secret_file(path: &Path, contents: &[u8]) -> Result<()> {
    let shown = path.display();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!("{shown}: cannot create (an existing key is never overwritten)")
        })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("{shown}: cannot write"))
}
