//! `chime keygen FILE`: a new Roughtime long-term key. The file is created with mode 0600 and
//! never overwritten: losing a long-term key to a typo would orphan every client configured
//! with its public key.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_roughtime::{LongTermKey, encode_key_file};
use zeroize::Zeroizing;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where to write the key; must not exist yet
    file: PathBuf,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let shown = args.file.display();
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&args.file)
        .with_context(|| {
            format!("{shown}: cannot create (an existing key is never overwritten)")
        })?;
    file.write_all(encode_key_file(&seed).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("{shown}: cannot write"))?;
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
