//! NTS-KE (RFC 8915 §4) on the control plane: TLS 1.3 over TCP, one short session per client,
//! at most [`MAX_SESSIONS`] at a time, each step of each bounded (`slots`). The session's records
//! are answered by `chime_ntp::nts`; the two keys come from the TLS exporter; the cookies are
//! sealed under the master keys the NTP workers open them with, which [`rotate`] replaces on a
//! schedule (the one before still opens, so no cookie in use dies at a rotation), or on a fleet
//! [`follow_fleet`] derives from the fleet secret for each period. SIGHUP reloads the certificate
//! and key, for renewals without a restart, and the fleet secret.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use chime_ntp::nts::{self, CookieKeys, KeOutcome};
use chime_ntp::{ClientTable, Coin, Verdict};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::LazyConfigAcceptor;
use tracing::{debug, error, info, warn};

use crate::access::Rules;
use crate::access::per_address::{PerAddress, Place};
use crate::nts::keys::{self as nts_keys, How};
use crate::nts::slots::{SessionId, Slots, Step};
use crate::observe::metrics::{counters, single};
use crate::service::{self, Beat, ServiceError, Threads, panic_message};
use tokio_util::sync::CancellationToken;

/// Sessions served at once, over all the NTS-KE threads. More than 250 addresses can hold at
/// [`MAX_SESSIONS_PER_ADDRESS`] each, so that an attack from that many stalls only until its
/// steps' deadlines; past it, a new connection takes the slot of the session that did least
/// (`slots`). A session waiting for its ClientHello holds a socket and a task; one past it,
/// rustls's state too, for at most its step's deadline. Measured: 38-40 MB resident at the peak
/// with some 1,800 hostile connections open, against 12 MB serving no attack
/// (ntpperf-results/2026-11-26-nts-ke-attack/).
pub(crate) const MAX_SESSIONS: usize = 4096;
/// Sessions served at once for one client address; more are closed at once (counted as
/// `address_limited`), so that one host holding connections open cannot take every slot. A pool
/// whose token is accepted gives its session's place up: its sessions are bounded by
/// [`MAX_KEPT_ALIVE`] instead.
const MAX_SESSIONS_PER_ADDRESS: usize = 8;
/// Cookies handed out per session, as chronyd.
const COOKIES: usize = 8;
/// Pools' sessions kept open between requests at once; past it, a pool asking to keep its
/// session open is answered and closed, as it would be without Keep Alive.
const MAX_KEPT_ALIVE: usize = 16;
/// How long a kept session may wait for the pool's next request before it is closed.
const KEPT_ALIVE_IDLE: Duration = Duration::from_secs(10);

/// What the NTS-KE server has done, for the log at exit and the metrics, and when the
/// certificate it serves expires (Unix seconds; `i64::MIN` if unknown).
#[derive(Debug)]
pub(crate) struct KeCounts {
    pub(crate) agreed: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Connections closed unserved by `--nts-ratelimit`.
    pub(crate) rate_limited: AtomicU64,
    /// Connections closed unserved: their address already had [`MAX_SESSIONS_PER_ADDRESS`].
    pub(crate) address_limited: AtomicU64,
    /// Connections closed unserved: `--allow`/`--deny` refuse their address.
    pub(crate) denied: AtomicU64,
    /// Sessions closed, every slot being taken, for a new connection: they had stalled longest.
    pub(crate) evicted: AtomicU64,
    /// The failed sessions (also in `failed`) by what went wrong: the TLS handshake (or bytes
    /// that are not TLS), a step's deadline, the request (too long, or cut off before End of
    /// Message), or reading and writing.
    pub(crate) failed_tls: AtomicU64,
    pub(crate) failed_timeout: AtomicU64,
    pub(crate) failed_request: AtomicU64,
    pub(crate) failed_io: AtomicU64,
    /// The agreed sessions (also in `agreed`) by AEAD algorithm, in [`nts::Aead::ALL`]'s order.
    pub(crate) agreed_aead: [AtomicU64; nts::Aead::ALL.len()],
    /// Sessions of pools whose token is accepted (`--nts-pool-tokens`), and their requests: for
    /// cookies sealing a client's keys, for what is served, and refused for a token not accepted
    /// (those sessions are also `refused`).
    pub(crate) pool: AtomicU64,
    pub(crate) pool_keys: AtomicU64,
    pub(crate) pool_support: AtomicU64,
    pub(crate) pool_refused: AtomicU64,
    /// Answers with cookies (a client's agreed session, a pool's key request) by the protocol
    /// their keys are for, in [`PROTOCOLS`]' order.
    pub(crate) keys_protocol: [AtomicU64; PROTOCOLS.len()],
    pub(crate) certificate_not_after: AtomicI64,
}

/// The protocols NTS-KE hands out keys for, as the metrics and the log label them, in
/// [`nts::Protocol::index`] order.
const PROTOCOLS: [&str; nts::Protocol::ALL.len()] = ["ntpv4", "ntpv5-draft"];

impl Default for KeCounts {
    fn default() -> Self {
        Self {
            agreed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            address_limited: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            failed_tls: AtomicU64::new(0),
            failed_timeout: AtomicU64::new(0),
            failed_request: AtomicU64::new(0),
            failed_io: AtomicU64::new(0),
            agreed_aead: std::array::from_fn(|_| AtomicU64::new(0)),
            pool: AtomicU64::new(0),
            pool_keys: AtomicU64::new(0),
            pool_support: AtomicU64::new(0),
            pool_refused: AtomicU64::new(0),
            keys_protocol: std::array::from_fn(|_| AtomicU64::new(0)),
            certificate_not_after: AtomicI64::new(i64::MIN),
        }
    }
}

impl KeCounts {
    pub(crate) fn line(&self) -> String {
        let mut line = format!(
            "agreed={} refused={} failed={} rate_limited={} address_limited={} denied={} \
             evicted={}",
            self.agreed.load(Relaxed),
            self.refused.load(Relaxed),
            self.failed.load(Relaxed),
            self.rate_limited.load(Relaxed),
            self.address_limited.load(Relaxed),
            self.denied.load(Relaxed),
            self.evicted.load(Relaxed)
        );
        for (kind, n) in self.failures() {
            line.push_str(&format!(" failed.{kind}={n}"));
        }
        for (aead, n) in self.by_aead() {
            line.push_str(&format!(" agreed.aead{aead}={n}"));
        }
        line.push_str(&format!(" pool={}", self.pool.load(Relaxed)));
        for (request, n) in self.pool_requests() {
            line.push_str(&format!(" pool.{request}={n}"));
        }
        for (protocol, n) in self.by_protocol() {
            line.push_str(&format!(" keys.{protocol}={n}"));
        }
        line
    }

    /// NTS-KE as `chime status` shows it: the sessions by outcome, and the certificate's expiry.
    /// An expired certificate is a problem (no client completes a handshake), one within a week
    /// of it a warning.
    pub(crate) fn status(&self, health: &mut crate::control::Health) -> serde_json::Value {
        let not_after = self.certificate_not_after.load(Relaxed);
        let left = (not_after != i64::MIN).then(|| not_after - crate::clock::read().unix_secs());
        match left {
            Some(left) if left <= 0 => health
                .problems
                .push("nts: the certificate has expired: renew it and send SIGHUP".into()),
            Some(left) if left < 7 * 86_400 => health.warnings.push(format!(
                "nts: the certificate expires in {} h: renew it and send SIGHUP",
                left / 3600
            )),
            _ => {}
        }
        let map = |pairs: &[(&str, u64)]| -> serde_json::Map<String, serde_json::Value> {
            pairs
                .iter()
                .map(|(k, n)| ((*k).to_owned(), (*n).into()))
                .collect()
        };
        serde_json::json!({
            "agreed": self.agreed.load(Relaxed),
            "refused": self.refused.load(Relaxed),
            "failed": self.failed.load(Relaxed),
            "failed_by_kind": map(&self.failures()),
            "rate_limited": self.rate_limited.load(Relaxed),
            "address_limited": self.address_limited.load(Relaxed),
            "denied": self.denied.load(Relaxed),
            "evicted": self.evicted.load(Relaxed),
            "pool_sessions": self.pool.load(Relaxed),
            "keys_by_protocol": map(&self.by_protocol()),
            "certificate_not_after": (not_after != i64::MIN).then_some(not_after),
        })
    }

    /// Answers with cookies by the protocol their keys are for, as the metrics label them.
    pub(crate) fn by_protocol(&self) -> [(&'static str, u64); PROTOCOLS.len()] {
        std::array::from_fn(|i| (PROTOCOLS[i], self.keys_protocol[i].load(Relaxed)))
    }

    /// Pools' requests by kind, as the metrics label them.
    pub(crate) fn pool_requests(&self) -> [(&'static str, u64); 3] {
        [
            ("keys", self.pool_keys.load(Relaxed)),
            ("support", self.pool_support.load(Relaxed)),
            ("refused", self.pool_refused.load(Relaxed)),
        ]
    }

    /// The agreed sessions by the AEAD algorithm's IANA number.
    pub(crate) fn by_aead(&self) -> [(u16, u64); nts::Aead::ALL.len()] {
        std::array::from_fn(|i| (nts::Aead::ALL[i].id(), self.agreed_aead[i].load(Relaxed)))
    }

    /// The failed sessions by kind, as the metrics label them.
    pub(crate) fn failures(&self) -> [(&'static str, u64); 4] {
        [
            ("tls", self.failed_tls.load(Relaxed)),
            ("timeout", self.failed_timeout.load(Relaxed)),
            ("request", self.failed_request.load(Relaxed)),
            ("io", self.failed_io.load(Relaxed)),
        ]
    }
}

/// A loaded certificate and key: the TLS configuration, and when the certificate expires.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) config: Arc<ServerConfig>,
    /// The leaf certificate's notAfter, Unix seconds, if it could be read.
    pub(crate) not_after: Option<i64>,
}

/// Why the NTS-KE certificate and key could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: readable by everyone (mode {mode:04o}); run chmod o-r on it", path.display())]
    Readable { path: PathBuf, mode: u32 },
    #[error("{}: {source}", path.display())]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: certificate {number} of the chain is not X.509: {reason}", path.display())]
    NotX509 {
        path: PathBuf,
        number: usize,
        reason: x509_cert::der::Error,
    },
    #[error("{}: no private key in it", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: the private key is not the certificate's ({})", key.display(), certificate.display())]
    KeyMismatch { certificate: PathBuf, key: PathBuf },
    #[error("{} and {}: {source}", certificate.display(), key.display())]
    Rustls {
        certificate: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

impl TlsError {
    /// The setting whose file is at fault: `nts.private-key` for the key file's own errors,
    /// `nts.certificate` otherwise.
    pub(crate) fn setting(&self, private_key: &Path) -> &'static str {
        match self {
            Self::Io { path, .. } | Self::Readable { path, .. } | Self::Pem { path, .. }
                if path == private_key =>
            {
                "nts.private-key"
            }
            Self::NoKey { .. } | Self::KeyMismatch { .. } => "nts.private-key",
            _ => "nts.certificate",
        }
    }
}

/// Logs when the certificate expires, with a warning if that is within a week or past.
pub(crate) fn log_expiry(certificate: &Path, not_after: Option<i64>) {
    let Some(t) = not_after else {
        warn!(
            "nts: cannot read the expiry of {}; chimed_nts_certificate_not_after_seconds is absent",
            certificate.display()
        );
        return;
    };
    let when = jiff::Timestamp::from_second(t).map_or_else(|_| t.to_string(), |ts| ts.to_string());
    let left = t - crate::clock::read().unix_secs();
    if left < 7 * 86_400 {
        warn!(
            "nts: the certificate {} expires at {when} ({} h from now): renew it and send SIGHUP",
            certificate.display(),
            left / 3600
        );
    } else {
        info!(
            "nts: certificate {} valid until {when}",
            certificate.display()
        );
    }
}

/// The notAfter of an X.509 certificate, as Unix seconds (`None` past what they hold).
fn not_after(cert: &x509_cert::Certificate) -> Option<i64> {
    let after = cert.tbs_certificate.validity.not_after.to_unix_duration();
    i64::try_from(after.as_secs()).ok()
}

/// The TLS 1.3 server configuration from a PEM certificate chain and private key, with NTS-KE's
/// ALPN, and when the leaf certificate expires. The key file must not be readable by others.
/// Errors name the file and the problem. The chain is parsed with RustCrypto's x509-cert, a
/// maintained parser of untrusted DER rather than one of our own.
pub(crate) fn load(certificate: &Path, private_key: &Path) -> Result<Loaded, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let pem = |path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Pem { path, source }
    };
    let mode = std::fs::metadata(private_key)
        .map_err(|source| TlsError::Io {
            path: private_key.to_owned(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o004 != 0 {
        return Err(TlsError::Readable {
            path: private_key.to_owned(),
            mode: mode & 0o777,
        });
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate)
        .map_err(pem(certificate))?
        .collect::<Result<_, _>>()
        .map_err(pem(certificate))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: certificate.to_owned(),
        });
    }
    // rustls parses only the leaf (to match it with the key; a bad one is "invalid peer
    // certificate: BadEncoding") and sends the rest as they are: each is parsed here, to be
    // refused by its place in the chain rather than by a client's failed handshake.
    let mut leaf_not_after = None;
    for (i, der) in chain.iter().enumerate() {
        use x509_cert::der::Decode as _;
        let cert = x509_cert::Certificate::from_der(der).map_err(|reason| TlsError::NotX509 {
            path: certificate.to_owned(),
            number: i + 1,
            reason,
        })?;
        if i == 0 {
            leaf_not_after = not_after(&cert);
        }
    }
    let key = PrivateKeyDer::from_pem_file(private_key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: private_key.to_owned(),
        },
        e => pem(private_key)(e),
    })?;
    let rustls = |source| match source {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            certificate: certificate.to_owned(),
            key: private_key.to_owned(),
        },
        source => TlsError::Rustls {
            certificate: certificate.to_owned(),
            key: private_key.to_owned(),
            source,
        },
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(rustls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(rustls)?;
    config.alpn_protocols = vec![nts::ALPN.to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        not_after: leaf_not_after,
    })
}

/// A new master key and its id, from fresh random bits.
fn fresh_key() -> (u32, [u8; nts::KEY_LEN]) {
    (rand::random(), rand::random())
}

/// The master keys to start with: those saved in `--nts-dump-dir` if any (on their schedule, see
/// [`nts_keys::resume`]), else fresh ones. What changed is saved back. The keys read at start are
/// taken out of the settings, which live as long as the process: no copy of a master key outlives
/// its rotations.
pub(crate) fn starting_keys(
    dump: &mut Option<(PathBuf, Option<nts_keys::Saved>)>,
    rotation: nts_keys::Rotation,
) -> nts_keys::Resumed {
    let now = crate::clock::read().unix_secs();
    let saved = dump.as_mut().and_then(|(_, saved)| saved.take());
    let r = nts_keys::resume(saved, now, rotation, fresh_key);
    if let Some((path, _)) = dump {
        let (shown, id) = (path.display(), r.saved.keys.current_id());
        let next = r.next_rotation.as_secs();
        match r.how {
            How::Fresh => info!("nts: no cookie keys in {shown} yet: new key (id {id:08x})"),
            How::Kept => info!(
                "nts: cookie keys read from {shown}: clients' cookies still open (id {id:08x}, \
                 next rotation in {next} s)"
            ),
            How::Rotated => info!(
                "nts: cookie keys read from {shown} and rotated, as was due: clients' cookies \
                 still open (id {id:08x})"
            ),
            How::Expired => info!(
                "nts: the cookie keys in {shown} are older than the {} rotations kept: new key \
                 (id {id:08x})",
                rotation.kept + 1
            ),
        }
        if r.how != How::Kept {
            save_keys(path, &r.saved);
        }
    }
    r
}

/// Saves the keys, or says why it could not: serving goes on, but the next restart will cost
/// every client a NAK and a new handshake.
fn save_keys(path: &Path, saved: &nts_keys::Saved) {
    if let Err(e) = nts_keys::save(path, saved) {
        warn!(
            "nts: cannot save the cookie keys to {}: {e}; clients' cookies will not survive a \
             restart",
            path.display()
        );
    }
}

/// Replaces the cookie master key `first` from now, then every `rotation.every`, keeping
/// `rotation.kept` keys before it, and saves each new set to `dump` (before it is used, so a
/// saved file always opens every cookie handed out).
pub(crate) async fn rotate(
    cookies: nts_keys::InForce,
    first: Duration,
    rotation: nts_keys::Rotation,
    dump: Option<PathBuf>,
) -> Result<(), ServiceError> {
    fail::fail_point!("nts-cookie-keys", |_| Err(
        crate::service::fail_point_error("nts-cookie-keys")
    ));
    tokio::time::sleep(first).await;
    let mut tick = tokio::time::interval(rotation.every);
    loop {
        tick.tick().await;
        let (id, key) = fresh_key();
        let next = cookies.load().rotated(id, key, rotation.kept);
        if let Some(path) = &dump {
            let saved = nts_keys::Saved {
                keys: next.clone(),
                made_unix: crate::clock::read().unix_secs(),
            };
            save_keys(path, &saved);
        }
        cookies.store(Arc::new(next));
        info!("nts: cookie key rotated (id {id:08x})");
    }
}

/// A fleet member's cookie keys to start with (`--nts-fleet-key`), for the period it is in.
pub(crate) fn fleet_start(fleet: &nts_keys::Fleet) -> (CookieKeys, Duration) {
    let (keys, period, left) = nts_keys::fleet_keys(
        &fleet.secrets,
        fleet.rotation,
        crate::clock::read().unix_micros(),
    );
    info!(
        "nts: cookie keys derived from the fleet secret in {} (period {period} of {} s, id \
         {:08x}{}): every server holding it opens these cookies",
        fleet.path.display(),
        fleet.rotation.every.as_secs().max(1),
        keys.current_id(),
        if fleet.secrets.1.is_some() {
            ", the previous secret's open too"
        } else {
            ""
        }
    );
    (keys, left)
}

/// A fleet member's cookie keys (`--nts-fleet-key`): at every period's start, the keys derived for
/// it from the secrets as last read (SIGHUP replaces them, see [`reload_fleet`]).
pub(crate) async fn follow_fleet(
    cookies: nts_keys::InForce,
    secrets: Arc<ArcSwap<nts_keys::FleetSecrets>>,
    rotation: nts_keys::Rotation,
) -> Result<(), ServiceError> {
    fail::fail_point!("nts-fleet-keys", |_| Err(crate::service::fail_point_error(
        "nts-fleet-keys"
    )));
    loop {
        let (_, _, left) = nts_keys::fleet_keys(
            &secrets.load(),
            rotation,
            crate::clock::read().unix_micros(),
        );
        // A little past the boundary, so that the clock read after the sleep is in the new
        // period; and reading it again, rather than counting, follows any step of the clock.
        tokio::time::sleep(left + Duration::from_millis(1)).await;
        let (keys, number, _) = nts_keys::fleet_keys(
            &secrets.load(),
            rotation,
            crate::clock::read().unix_micros(),
        );
        let id = keys.current_id();
        cookies.store(Arc::new(keys));
        info!("nts: fleet cookie key for period {number} (id {id:08x})");
    }
}

/// SIGHUP with `--nts-fleet-key`: reads the fleet secret file again and, if it loads, puts the
/// keys derived from it in force at once; otherwise says why and keeps the secrets in force.
pub(crate) fn reload_fleet(
    path: &Path,
    secrets: &ArcSwap<nts_keys::FleetSecrets>,
    cookies: &ArcSwap<CookieKeys>,
    rotation: nts_keys::Rotation,
) {
    match nts_keys::load_fleet(path) {
        Ok(loaded) => {
            let previous = loaded.1.is_some();
            let (keys, number, _) =
                nts_keys::fleet_keys(&loaded, rotation, crate::clock::read().unix_micros());
            let id = keys.current_id();
            secrets.store(Arc::new(loaded));
            cookies.store(Arc::new(keys));
            info!(
                "SIGHUP: NTS fleet secret reloaded from {} (period {number}, id {id:08x}{})",
                path.display(),
                if previous {
                    ", the previous secret's cookies open too"
                } else {
                    ""
                }
            );
        }
        Err(e) => warn!("SIGHUP: NTS fleet secret: {e}; keeping the one in force"),
    }
}

/// What NTS-KE's secrets in force are read through, each replaced on SIGHUP or at a rotation:
/// the TLS configuration, the cookie keys, and the pools' tokens.
pub(crate) type KeKeys = (
    Arc<ArcSwap<ServerConfig>>,
    nts_keys::InForce,
    Arc<ArcSwap<nts::PoolTokens>>,
);

/// What every NTS-KE thread shares, so that a limit holds for the server as a whole whichever
/// thread accepts a connection: the certificate and cookie keys in force, the counts, the
/// session slots, the sessions open per address, `--nts-ratelimit`'s table, and the access rules
/// (NTP's, which SIGHUP reloads).
pub(crate) struct KeShared {
    pub(crate) tls: Arc<ArcSwap<ServerConfig>>,
    pub(crate) cookies: nts_keys::InForce,
    pub(crate) ntp: Arc<nts::NtpNegotiation>,
    pub(crate) counts: Arc<KeCounts>,
    /// The tokens of the pools this server is a member of (SIGHUP reloads them).
    pub(crate) pool: Arc<ArcSwap<nts::PoolTokens>>,
    /// Pools' sessions kept open now, at most [`MAX_KEPT_ALIVE`].
    kept_alive: AtomicUsize,
    limiter: Option<Arc<ClientTable>>,
    /// Who is served (NTP's rules, which SIGHUP reloads).
    access: Arc<Rules>,
    /// Whether NTPv5 is offered (the NTP workers speak it).
    ntpv5: bool,
    /// The sessions in progress, each with the token that closes it.
    slots: Mutex<Slots<CancellationToken>>,
    per_address: PerAddress,
    /// The rate limiter's clock starts here, the same for every thread.
    epoch: std::time::Instant,
}

impl KeShared {
    pub(crate) fn new(
        (tls, cookies, pool): KeKeys,
        ntp: Arc<nts::NtpNegotiation>,
        counts: Arc<KeCounts>,
        limiter: Option<Arc<ClientTable>>,
        (access, ntpv5): (Arc<Rules>, bool),
    ) -> Self {
        Self {
            tls,
            cookies,
            ntp,
            counts,
            pool,
            kept_alive: AtomicUsize::new(0),
            limiter,
            access,
            ntpv5,
            slots: Mutex::new(Slots::new(MAX_SESSIONS)),
            per_address: PerAddress::default(),
            epoch: std::time::Instant::now(),
        }
    }
}

/// The NTS-KE threads (`--nts-ke-threads`), each accepting on the one listener with its own
/// single-threaded runtime, so that a flood of handshakes delays neither the control plane's
/// upstream polls nor its key rotations. Each runtime beats its thread's heartbeat for the
/// watchdog, which a handshake that blocked the thread would stop.
pub(crate) struct KeThreads {
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl KeThreads {
    /// Starts one thread named `nts-ke` per heartbeat in `beats`, serving `listener` until
    /// `stopped` is cancelled; each logs in the span current here.
    pub(crate) fn spawn(
        listener: &std::net::TcpListener,
        shared: &Arc<KeShared>,
        beats: Vec<Beat>,
        stopped: &CancellationToken,
    ) -> std::io::Result<Self> {
        let mut handles = Vec::new();
        let span = tracing::Span::current();
        for beat in beats {
            let span = span.clone();
            let (listener, shared, stopped) =
                (listener.try_clone()?, shared.clone(), stopped.clone());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(
                std::thread::Builder::new()
                    .name("nts-ke".into())
                    .spawn(move || {
                        let _entered = span.entered();
                        runtime.block_on(async move {
                            // Ended with the runtime, when `serve` returns.
                            tokio::spawn(service::beat_on_every_wake(beat));
                            serve(listener, shared, stopped).await;
                        });
                    })?,
            );
        }
        Ok(Self { handles })
    }
}

impl Threads for KeThreads {
    fn any_finished(&self) -> bool {
        self.handles
            .iter()
            .any(std::thread::JoinHandle::is_finished)
    }

    /// Waits for the threads, which stop accepting and end the sessions in progress once the
    /// stop signal is given.
    fn stop(self: Box<Self>) -> Result<(), String> {
        let mut result = Ok(());
        for h in self.handles {
            if let Err(panic) = h.join() {
                result = result.and(Err(panic_message(panic)));
            }
        }
        result
    }
}

/// Accepts NTS-KE sessions on `listener` (one thread's clone of it) until `stopped`. With the
/// rate limiter (`--nts-ratelimit`), a connection from an address over its limit is closed at
/// once, before the TLS handshake it would cost.
async fn serve(listener: std::net::TcpListener, shared: Arc<KeShared>, stopped: CancellationToken) {
    fail::fail_point!("nts-ke", |_| ());
    let mut coin = Coin::new(rand::random());
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            // The thread ends, and with it the service: the supervisor stops chimed.
            error!("nts-ke: cannot serve: {e}");
            return;
        }
    };
    let counts = &shared.counts;
    loop {
        // No slot is taken before a connection is accepted: an idle thread holds none.
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stopped.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                debug!("nts-ke: accept: {e}");
                continue;
            }
        };
        // The access rules first, as for NTP and Roughtime: a denied address costs no TLS.
        let acl = shared.access.load();
        if !acl.serves(peer.ip()) {
            counts.denied.fetch_add(1, Relaxed);
            debug!(%peer, "nts-ke: refused by the access rules, closed");
            continue;
        }
        if let Some(table) = &shared.limiter {
            let now_ns = shared.epoch.elapsed().as_nanos() as u64;
            if !matches!(table.check(peer.ip(), now_ns, &mut coin), Verdict::Answer) {
                counts.rate_limited.fetch_add(1, Relaxed);
                debug!(%peer, "nts-ke: over its rate limit, closed");
                continue;
            }
        }
        let Some(place) = shared.per_address.take(peer.ip(), MAX_SESSIONS_PER_ADDRESS) else {
            counts.address_limited.fetch_add(1, Relaxed);
            debug!(%peer, "nts-ke: {MAX_SESSIONS_PER_ADDRESS} sessions from it already, closed");
            continue;
        };
        let closing = CancellationToken::new();
        let id = shared.admit(closing.clone());
        let shared = shared.clone();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                outcome = session(stream, &shared, id, place) => Some(outcome),
                () = closing.cancelled() => None,
            };
            shared.lock_slots().release(id);
            shared.count(peer, outcome);
        });
    }
}

impl KeShared {
    fn lock_slots(&self) -> std::sync::MutexGuard<'_, Slots<CancellationToken>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a session accepted now, closing the one that did least if none is free.
    fn admit(&self, closing: CancellationToken) -> SessionId {
        let admitted = self.lock_slots().admit(std::time::Instant::now(), closing);
        if let Some((evicted, step)) = admitted.closed {
            debug!(
                "nts-ke: every slot taken: closing a session stalled in its {}",
                step.name()
            );
            evicted.cancel();
        }
        admitted.id
    }

    /// Session `id` has reached `step`.
    fn enter(&self, id: SessionId, step: Step) {
        self.lock_slots().enter(id, step, std::time::Instant::now());
    }

    /// Counts an answer with cookies by the protocol of their keys, and a pool's request by kind.
    fn count_request(&self, answer: Answer) {
        let counts = &self.counts;
        if let Answer::Agreed(_, protocol) | Answer::PoolKeys(protocol) = answer {
            counts.keys_protocol[protocol.index()].fetch_add(1, Relaxed);
        }
        let n = match answer {
            Answer::PoolKeys(_) => &counts.pool_keys,
            Answer::PoolSupport => &counts.pool_support,
            Answer::PoolRefused => &counts.pool_refused,
            Answer::Agreed(..) | Answer::Refused => return,
        };
        n.fetch_add(1, Relaxed);
    }

    /// Counts a session's outcome: `None` if it was closed for another.
    fn count(&self, peer: std::net::SocketAddr, outcome: Option<Result<Served, Failure>>) {
        let counts = &self.counts;
        let kind = match outcome {
            Some(Ok(Served::Agreed(aead))) => {
                counts.agreed_aead[aead.index()].fetch_add(1, Relaxed);
                &counts.agreed
            }
            Some(Ok(Served::Refused)) => &counts.refused,
            Some(Ok(Served::Pool)) => &counts.pool,
            None => &counts.evicted,
            Some(Err(failure)) => {
                debug!(%peer, "nts-ke: session failed: {failure}");
                counts.failed.fetch_add(1, Relaxed);
                match failure {
                    Failure::Tls(_) => &counts.failed_tls,
                    Failure::Timeout(_) => &counts.failed_timeout,
                    Failure::Request(_) => &counts.failed_request,
                    Failure::Io(_) => &counts.failed_io,
                }
            }
        };
        kind.fetch_add(1, Relaxed);
    }
}

/// How a session failed.
#[derive(Debug)]
enum Failure {
    /// The TLS handshake failed: not TLS, no common ALPN or version, an alert.
    Tls(String),
    /// The client stalled in this step past its deadline.
    Timeout(Step),
    /// The request was too long, or the client closed before End of Message.
    Request(String),
    /// Reading, writing or exporting the keys failed.
    Io(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tls(e) => write!(f, "TLS: {e}"),
            Self::Timeout(step) => write!(f, "timed out in its {}", step.name()),
            Self::Request(e) | Self::Io(e) => f.write_str(e),
        }
    }
}

/// `work`, which must end by `step`'s deadline.
async fn by_deadline<T>(
    step: Step,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let late = tokio::time::timeout(step.deadline(), work).await;
    late.unwrap_or(Err(Failure::Timeout(step)))
}

/// How a session ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// A client's keys agreed under this algorithm, and cookies handed out.
    Agreed(nts::Aead),
    /// Refused with an error record, or with nothing served among what was offered.
    Refused,
    /// A pool's session, its token accepted: one request or more, each counted by kind.
    Pool,
}

/// What one request was answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Agreed(nts::Aead, nts::Protocol),
    Refused,
    PoolKeys(nts::Protocol),
    PoolSupport,
    PoolRefused,
}

/// One of the [`MAX_KEPT_ALIVE`] places of a pool's session kept open, given back when dropped
/// (the session may end at any await, closed for another).
struct KeptAlive<'a>(&'a AtomicUsize);

impl<'a> KeptAlive<'a> {
    fn take(kept: &'a AtomicUsize) -> Option<Self> {
        let room = |n: usize| (n < MAX_KEPT_ALIVE).then_some(n + 1);
        kept.fetch_update(Relaxed, Relaxed, room).ok()?;
        Some(Self(kept))
    }
}

impl Drop for KeptAlive<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// One session, step by step, each by its deadline: the ClientHello, the rest of the TLS
/// handshake (with the certificate in force then: SIGHUP may replace it), the client's records
/// up to End of Message, the answer. A pool that asks to keep its session open, and gets one of
/// the [`MAX_KEPT_ALIVE`] places, may send its next request within [`KEPT_ALIVE_IDLE`] of the
/// answer, and so on. `place` is the session's among those of its client address; a pool whose
/// token is accepted gives it up, since a pool is one address that may keep many sessions open.
async fn session(
    stream: tokio::net::TcpStream,
    shared: &KeShared,
    id: SessionId,
    place: Place,
) -> Result<Served, Failure> {
    let mut place = Some(place);
    let tls_error = |e: std::io::Error| Failure::Tls(e.to_string());
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let hello = by_deadline(Step::Hello, async { acceptor.await.map_err(tls_error) }).await?;
    shared.enter(id, Step::Handshake);
    let config = shared.tls.load_full();
    let handshake = async { hello.into_stream(config).await.map_err(tls_error) };
    let mut tls = by_deadline(Step::Handshake, handshake).await?;
    let mut kept: Option<KeptAlive<'_>> = None;
    loop {
        shared.enter(id, Step::Request);
        let request = if kept.is_none() {
            by_deadline(Step::Request, read_request(&mut tls)).await?
        } else {
            match tokio::time::timeout(KEPT_ALIVE_IDLE, read_request(&mut tls)).await {
                Ok(Ok(request)) => request,
                // The pool closed its session, or let it idle: it ends here, served.
                Ok(Err(Failure::Request(_))) | Err(_) => return Ok(Served::Pool),
                Ok(Err(e)) => return Err(e),
            }
        };
        shared.enter(id, Step::Response);
        let ntpv5 = shared.ntpv5;
        let mut outcome = nts::ke_check(&request, &shared.pool.load(), ntpv5);
        if outcome.keep_alive() && kept.is_none() {
            kept = KeptAlive::take(&shared.kept_alive);
        }
        let keep = outcome.keep_alive() && kept.is_some();
        if let KeOutcome::PoolSupport { keep_alive, .. } | KeOutcome::PoolKeys { keep_alive, .. } =
            &mut outcome
        {
            *keep_alive = keep;
        }
        let (response, answer) = respond(&outcome, &tls, shared)?;
        shared.count_request(answer);
        if matches!(answer, Answer::PoolKeys(_) | Answer::PoolSupport) {
            drop(place.take());
        }
        let io = |e: std::io::Error| Failure::Io(e.to_string());
        by_deadline(Step::Response, async {
            tls.write_all(&response).await.map_err(io)?;
            if !keep {
                tls.shutdown().await.map_err(io)?;
            }
            Ok(())
        })
        .await?;
        if !keep {
            return Ok(match answer {
                Answer::Agreed(aead, _) => Served::Agreed(aead),
                Answer::PoolKeys(_) | Answer::PoolSupport => Served::Pool,
                Answer::Refused | Answer::PoolRefused if kept.is_some() => Served::Pool,
                Answer::Refused | Answer::PoolRefused => Served::Refused,
            });
        }
    }
}

type Tls = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// The client's records up to End of Message, at most [`nts::KE_MAX_REQUEST`] bytes.
async fn read_request(tls: &mut Tls) -> Result<Vec<u8>, Failure> {
    let mut request = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    let len = loop {
        if let Some(len) = nts::ke_message_len(&request) {
            break len;
        }
        if request.len() > nts::KE_MAX_REQUEST {
            return Err(Failure::Request("request longer than 16 KiB".into()));
        }
        let n = tls
            .read(&mut chunk)
            .await
            .map_err(|e| Failure::Io(e.to_string()))?;
        if n == 0 {
            return Err(Failure::Request("closed before End of Message".into()));
        }
        request.extend_from_slice(&chunk[..n]);
    };
    request.truncate(len);
    Ok(request)
}

/// The answer to the request `outcome` decided: for a client's agreement, cookies sealing the keys
/// exported from its session; for a pool's fixed keys, cookies sealing those.
fn respond(
    outcome: &KeOutcome,
    tls: &Tls,
    shared: &KeShared,
) -> Result<(Vec<u8>, Answer), Failure> {
    let (keys, answer) = match outcome {
        KeOutcome::Agreed(agreement) => {
            let conn = tls.get_ref().1;
            let keys = agreement
                .export_keys(|context, key| {
                    conn.export_keying_material(key, nts::EXPORTER_LABEL, Some(context))
                        .map(drop)
                })
                .map_err(|e| Failure::Io(format!("key export: {e}")))?;
            (
                Some(keys),
                Answer::Agreed(agreement.aead, agreement.protocol),
            )
        }
        KeOutcome::PoolKeys { keys, protocol, .. } => {
            (Some(keys.clone()), Answer::PoolKeys(*protocol))
        }
        KeOutcome::PoolSupport { .. } => (None, Answer::PoolSupport),
        KeOutcome::PoolRefused => (None, Answer::PoolRefused),
        KeOutcome::NoProtocol | KeOutcome::NoAead(_) | KeOutcome::Error(_) => {
            (None, Answer::Refused)
        }
    };
    let master = shared.cookies.load();
    let fresh = keys.iter().flat_map(|keys| {
        std::iter::repeat_with(|| master.seal(keys, rand::random())).take(COOKIES)
    });
    let mut response = Vec::with_capacity(1024);
    nts::ke_response(outcome, &shared.ntp, fresh, &mut response);
    Ok((response, answer))
}

/// Writes NTS-KE's metrics: its sessions and its certificate.
pub(crate) fn encode(enc: &mut DescriptorEncoder, ke: &KeCounts) -> std::fmt::Result {
    counters(
        enc,
        "chimed_nts_ke_sessions_total",
        "NTS-KE sessions by outcome: agreed (cookies handed out), refused (an error record), \
         failed (TLS or I/O error, timeout; by kind in chimed_nts_ke_failures_total), \
         rate_limited (closed unserved, --nts-ratelimit), address_limited (closed unserved: \
         8 sessions from that address already), denied (closed unserved: --allow/--deny), \
         evicted (closed, every slot being taken, for a new connection: it had stalled \
         longest in its step), pool (an NTS pool's, its token accepted: its requests in \
         chimed_nts_ke_pool_requests_total).",
        [
            ("agreed", &ke.agreed),
            ("refused", &ke.refused),
            ("failed", &ke.failed),
            ("rate_limited", &ke.rate_limited),
            ("address_limited", &ke.address_limited),
            ("denied", &ke.denied),
            ("evicted", &ke.evicted),
            ("pool", &ke.pool),
        ]
        .map(|(outcome, n)| (vec![("outcome", outcome.to_string())], n.load(Relaxed))),
    )?;
    counters(
        enc,
        "chimed_nts_ke_agreed_total",
        "Agreed NTS-KE sessions by the AEAD algorithm of their keys, its IANA number: 15 \
         (AEAD_AES_SIV_CMAC_256), 17 (AEAD_AES_SIV_CMAC_512), 30 (AEAD_AES_128_GCM_SIV).",
        ke.by_aead()
            .map(|(aead, n)| (vec![("aead", aead.to_string())], n)),
    )?;
    counters(
        enc,
        "chimed_nts_ke_keys_total",
        "NTS-KE answers with cookies (a client's agreed session, an NTS pool's key request) by \
         the protocol their keys are for: ntpv4, ntpv5-draft (the NTPv5 draft, 0x8001, with \
         --ntpv5).",
        ke.by_protocol()
            .map(|(protocol, n)| (vec![("protocol", protocol.to_string())], n)),
    )?;
    counters(
        enc,
        "chimed_nts_ke_pool_requests_total",
        "NTS pools' requests (--nts-pool-tokens) by kind: keys (cookies made for a client's keys \
         the pool gave), support (what is served), refused (a pool's request without a token \
         accepted, answered Bad Request: a pool whose token is wrong, or a guess).",
        ke.pool_requests()
            .into_iter()
            .map(|(request, n)| (vec![("request", request.to_string())], n)),
    )?;
    counters(
        enc,
        "chimed_nts_ke_failures_total",
        "Failed NTS-KE sessions by kind: tls (the handshake: not TLS, no common protocol, an \
         alert), timeout (a step's deadline: 2 s for the ClientHello, 2 s for the rest of the \
         handshake, 1 s for the request after it, 2 s for the response), request (longer than \
         16 KiB, or cut off \
         before End of Message), io (reading or writing).",
        ke.failures()
            .into_iter()
            .map(|(kind, n)| (vec![("kind", kind.to_string())], n)),
    )?;
    let t = ke.certificate_not_after.load(Relaxed);
    if t != i64::MIN {
        single(
            enc,
            "chimed_nts_certificate_not_after_seconds",
            "When the NTS-KE certificate expires (its notAfter), Unix seconds; SIGHUP reloads it.",
            ConstGauge::new(t),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate in DER, valid until `not_after` (Unix seconds).
    fn certificate(not_after: i64) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["ntp.example".into()]).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// [`not_after`] of a certificate in DER; `None` if it does not parse.
    fn not_after_of(der: &[u8]) -> Option<i64> {
        use x509_cert::der::Decode as _;
        x509_cert::Certificate::from_der(der)
            .ok()
            .and_then(|c| not_after(&c))
    }

    #[test]
    fn not_after_is_read_from_the_der() {
        // 2026-11-24T00:43:41Z, a UTCTime; 2051-01-01T00:00:00Z, a GeneralizedTime (RFC 5280
        // §4.1.2.5: from 2050 on).
        for t in [1_795_481_021, 2_556_144_000] {
            assert_eq!(not_after_of(&certificate(t)), Some(t));
        }
        let whole = certificate(1_795_481_021);
        for cut in 0..whole.len() {
            // Cut short, it is not a certificate, and never a panic.
            assert_eq!(not_after_of(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(not_after_of(b"not DER"), None);
    }
}
