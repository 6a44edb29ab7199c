//! Key files: `chime keygen FILE`, a new Roughtime long-term key; `chime delegate`, a Roughtime
//! delegation bundle for one server, made from the long-term key where it lives; and `chime
//! nts-fleet-key FILE`, a new NTS fleet secret. Every file is created with mode 0600 and never
//! overwritten: losing a long-term key to a typo would orphan every client configured with its
//! public key, and losing a fleet secret every NTS client's cookies.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chime_ntp::nts::{FleetSecret, encode_fleet_file};
use chime_roughtime::{BundlePlan, LongTermKey, encode_key_file, make_bundle, parse_key_file};
use zeroize::Zeroizing;

use crate::out::outln;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where to write the key; must not exist yet
    file: PathBuf,
    /// An ML-DSA-44 key for the experimental post-quantum suite (0x90000001, part of no draft,
    /// TCP only; chimed --roughtime-mldsa-key) instead of an Ed25519 one
    #[cfg(feature = "mldsa")]
    #[arg(long)]
    mldsa: bool,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    #[cfg(feature = "mldsa")]
    if args.mldsa {
        use chime_roughtime::mldsa;
        create_secret_file(&args.file, &mldsa::encode_key_file(&seed))?;
        let public = mldsa::PqLongTermKey::from_seed(&seed).public_key();
        outln!(
            "ML-DSA-44 public key (base64, {} bytes): {}",
            public.len(),
            BASE64.encode(&public)
        );
        return Ok(());
    }
    create_secret_file(&args.file, &encode_key_file(&seed))?;
    let public = LongTermKey::from_seed(&seed).public_key();
    outln!("public key (base64): {}", BASE64.encode(public));
    outln!("public key (hex): {}", hex::encode(public));
    Ok(())
}

#[derive(Debug, clap::Args)]
pub(crate) struct DelegateArgs {
    /// The long-term key file (`chime keygen`); it stays here, the bundle goes to the server
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Where to write the bundle; must not exist yet
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Days the bundle covers from its start
    #[arg(long, value_name = "DAYS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3650))]
    days: u64,
    /// When the first window opens, in Unix seconds: to make a server's next bundle ahead of
    /// time, starting before the one in force runs out [default: an hour before now]
    #[arg(long, value_name = "UNIX_SECS")]
    start: Option<u64>,
    /// Hours from one online key's window to the next
    #[arg(long, value_name = "HOURS", default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=8760))]
    step_hours: u64,
    /// Hours each online key's window lasts: more than --step-hours, so windows overlap
    #[arg(long, value_name = "HOURS", default_value_t = 48, value_parser = clap::value_parser!(u64).range(2..=17520))]
    window_hours: u64,
}

/// How far before now the first window opens: a server whose clock is a little behind, or a
/// bundle installed a moment after it was made, still has a window.
const BUNDLE_BACKDATE_S: u64 = 3600;

/// `chime delegate`: a delegation bundle for one server (see `chime_roughtime::bundle`).
pub(crate) fn run_delegate(args: &DelegateArgs) -> Result<()> {
    let shown = args.key.display();
    // As chimed reads its keys: refused if group or others may read it.
    let text = chime_keyfile::read_existing(&args.key, "the Roughtime long-term key")?;
    let seed = parse_key_file(&text).with_context(|| format!("{shown}: not a key file"))?;
    let key = LongTermKey::from_seed(&seed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970")?
        .as_secs();
    // Without --start, backdated so that the bundle still covers `days` from now.
    let (start_unix_s, backdate) = match args.start {
        Some(start) => (start, 0),
        None => (now.saturating_sub(BUNDLE_BACKDATE_S), BUNDLE_BACKDATE_S),
    };
    let plan = BundlePlan {
        start_unix_s,
        span_s: args.days * 86_400 + backdate,
        step_s: args.step_hours * 3600,
        window_s: args.window_hours * 3600,
    };
    let bundle = make_bundle(&key, plan, rand::random)
        .map_err(|e| anyhow::anyhow!("--window-hours {}: {e}", args.window_hours))?;
    create_secret_file(&args.out, &bundle.encode())?;
    let last = bundle.windows().last().map_or(0, |d| d.maxt_unix_s());
    outln!(
        "{} online keys written to {}, covering Unix seconds {} .. {last}; the server needs \
         only this file (chimed --roughtime-delegation), never the long-term key",
        bundle.windows().len(),
        args.out.display(),
        plan.start_unix_s
    );
    outln!("public key (base64): {}", BASE64.encode(key.public_key()));
    if last <= now {
        eprintln!(
            "warning: every window of {} closed before now: a server given it signs nothing",
            args.out.display()
        );
    }
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
    create_secret_file(&args.file, &encode_fleet_file(&secret))?;
    outln!(
        "NTS fleet secret written to {}: give every member of the fleet this same file \
         (chimed --nts-fleet-key)",
        args.file.display()
    );
    Ok(())
}

/// Writes `text` to a new file at `path`, mode 0600 (`chime_keyfile::create`); an existing file
/// is an error, never overwritten.
fn create_secret_file(path: &Path, text: &str) -> Result<()> {
    chime_keyfile::create(path, text).with_context(|| {
        format!(
            "{}: cannot create (an existing key is never overwritten)",
            path.display()
        )
    })
}
