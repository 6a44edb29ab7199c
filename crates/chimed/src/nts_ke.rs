//! NTS-KE (RFC 8915 §4) on the control plane: TLS 1.3 over TCP, one short session per client,
//! at most [`MAX_SESSIONS`] at a time, each bounded to [`SESSION_TIMEOUT`]. The session's records
//! are answered by `chime_ntp::nts`; the two keys come from the TLS exporter; the cookies are
//! sealed under the master keys the NTP workers open them with, which [`rotate`] replaces on a
//! schedule (the one before still opens, so no cookie in use dies at a rotation). SIGHUP reloads
//! the certificate and key, for renewals without a restart.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use chime_ntp::nts::{self, CookieKeys, KeOutcome, Keys};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// Sessions served at once; more wait for a slot.
const MAX_SESSIONS: usize = 256;
/// The longest one session (handshake, request, response) may take.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);
/// Cookies handed out per session, as chronyd.
const COOKIES: usize = 8;

/// What the NTS-KE server has done, for the log at exit and the metrics.
#[derive(Debug, Default)]
pub(crate) struct KeCounts {
    pub(crate) agreed: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl KeCounts {
    pub(crate) fn line(&self) -> String {
        format!(
            "agreed={} refused={} failed={}",
            self.agreed.load(Relaxed),
            self.refused.load(Relaxed),
            self.failed.load(Relaxed)
        )
    }
}

/// The TLS 1.3 server configuration from a PEM certificate chain and private key, with NTS-KE's
/// ALPN. The key file must not be readable by others. Errors name the file and the problem.
pub(crate) fn tls_config(certificate: &Path, private_key: &Path) -> Result<ServerConfig, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = private_key.display();
    let mode = std::fs::metadata(private_key)
        .map_err(|e| format!("{shown}: {e}"))?
        .permissions()
        .mode();
    if mode & 0o004 != 0 {
        return Err(format!(
            "{shown}: readable by everyone (mode {:04o}); run chmod o-r on it",
            mode & 0o777
        ));
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate)
        .map_err(|e| format!("{}: {e}", certificate.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", certificate.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in it", certificate.display()));
    }
    let key = PrivateKeyDer::from_pem_file(private_key).map_err(|e| format!("{shown}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and {shown}: {e}", certificate.display()))?;
    config.alpn_protocols = vec![nts::ALPN.to_vec()];
    Ok(config)
}

/// Master keys from fresh random bits.
pub(crate) fn fresh_keys(before: Option<&CookieKeys>) -> CookieKeys {
    let (id, key) = (rand::random(), rand::random());
    match before {
        Some(b) => b.rotated(id, key),
        None => CookieKeys::new(id, key),
    }
}

/// Replaces the cookie master key every `every`.
pub(crate) async fn rotate(cookies: Arc<ArcSwap<CookieKeys>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let next = fresh_keys(Some(&cookies.load()));
        info!("nts: cookie key rotated (id {:08x})", next.current_id());
        cookies.store(Arc::new(next));
    }
}

/// Accepts NTS-KE sessions on `listener` until the task is aborted.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    tls: Arc<ArcSwap<ServerConfig>>,
    cookies: Arc<ArcSwap<CookieKeys>>,
    ntp_port: Option<u16>,
    counts: Arc<KeCounts>,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            warn!("nts-ke: cannot serve: {e}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_SESSIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                debug!("nts-ke: accept: {e}");
                continue;
            }
        };
        // The certificate in force now: SIGHUP may have replaced it.
        let acceptor = TlsAcceptor::from(tls.load_full());
        let (cookies, counts) = (cookies.clone(), counts.clone());
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(
                SESSION_TIMEOUT,
                session(stream, acceptor, &cookies, ntp_port),
            )
            .await;
            match outcome {
                Ok(Ok(true)) => counts.agreed.fetch_add(1, Relaxed),
                Ok(Ok(false)) => counts.refused.fetch_add(1, Relaxed),
                Ok(Err(e)) => {
                    debug!("nts-ke: {peer}: {e}");
                    counts.failed.fetch_add(1, Relaxed)
                }
                Err(_) => {
                    debug!("nts-ke: {peer}: timed out");
                    counts.failed.fetch_add(1, Relaxed)
                }
            };
            drop(permit);
        });
    }
}

/// One session: the TLS handshake, the client's records up to End of Message, the answer.
/// `Ok(true)` if keys were agreed and cookies handed out, `Ok(false)` if the request was refused
/// with an error record.
async fn session(
    stream: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    cookies: &ArcSwap<CookieKeys>,
    ntp_port: Option<u16>,
) -> Result<bool, String> {
    let mut tls = acceptor
        .accept(stream)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let mut request = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    let len = loop {
        if let Some(len) = nts::ke_message_len(&request) {
            break len;
        }
        if request.len() > nts::KE_MAX_REQUEST {
            return Err("request longer than 16 KiB".into());
        }
        let n = tls.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before End of Message".into());
        }
        request.extend_from_slice(&chunk[..n]);
    };
    let outcome = nts::ke_check(&request[..len]);
    let mut response = Vec::with_capacity(1024);
    let agreed = outcome == KeOutcome::Agreed;
    if agreed {
        let conn = tls.get_ref().1;
        let export = |context: &[u8]| {
            conn.export_keying_material([0u8; nts::KEY_LEN], nts::EXPORTER_LABEL, Some(context))
                .map_err(|e| format!("key export: {e}"))
        };
        let keys = Keys {
            c2s: export(&nts::EXPORTER_C2S)?,
            s2c: export(&nts::EXPORTER_S2C)?,
        };
        let master = cookies.load();
        nts::ke_response(
            &outcome,
            ntp_port,
            COOKIES,
            || master.seal(&keys, rand::random()),
            &mut response,
        );
    } else {
        nts::ke_response(&outcome, None, 0, || [0; nts::COOKIE_LEN], &mut response);
    }
    tls.write_all(&response).await.map_err(|e| e.to_string())?;
    tls.shutdown().await.map_err(|e| e.to_string())?;
    Ok(agreed)
}
