//! `chime ntp --nts`: NTS-KE over TLS 1.3 to the server (RFC 8915 §4), then one NTP exchange
//! authenticated with the keys and a cookie it handed out. Blocking, one connection, bounded by
//! the query's timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chime_ntp::nts::{self, KeAnswer, Keys};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// The NTS-KE port (RFC 8915).
pub(crate) const KE_PORT: u16 = 4460;

/// `--nts-aead`: the AEAD algorithms to offer in NTS-KE, in order of preference, by IANA number
/// or short name (`15` or `siv-cmac-256`, `17` or `siv-cmac-512`, `30` or `gcm-siv`), separated
/// by commas.
pub(crate) fn parse_aeads(list: &str) -> Result<AeadList, String> {
    let mut aeads = Vec::new();
    for name in list.split(',').map(str::trim) {
        let aead = match name {
            "siv-cmac-256" => Some(nts::Aead::AesSivCmac256),
            "siv-cmac-512" => Some(nts::Aead::AesSivCmac512),
            "gcm-siv" => Some(nts::Aead::Aes128GcmSiv),
            _ => name.parse().ok().and_then(nts::Aead::from_id),
        };
        let aead = aead.ok_or_else(|| {
            format!("{name:?} is not an AEAD served: 15 (siv-cmac-256), 17 (siv-cmac-512) or 30 (gcm-siv)")
        })?;
        if aeads.contains(&aead) {
            return Err(format!("{name} is listed twice"));
        }
        aeads.push(aead);
    }
    Ok(AeadList(aeads))
}

/// `--nts-aead`'s algorithms, one value to clap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AeadList(pub(crate) Vec<nts::Aead>);

/// The outcome of NTS-KE: the association's keys, what the server answered, and where to send
/// NTP.
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) keys: Keys,
    pub(crate) answer: KeAnswer,
    pub(crate) ntp: SocketAddr,
}

/// Splits `HOST[:PORT]` / `[IPv6]:PORT` into the host (as a TLS server name) and port.
pub(crate) fn split_host(spec: &str, default_port: u16) -> Result<(String, u16)> {
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.port()));
    }
    if spec.parse::<std::net::IpAddr>().is_ok() {
        return Ok((spec.to_owned(), default_port));
    }
    match spec.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            let port = port
                .parse()
                .with_context(|| format!("{spec}: '{port}' is not a port"))?;
            Ok((host.to_owned(), port))
        }
        _ => Ok((spec.to_owned(), default_port)),
    }
}

/// Runs NTS-KE with `host` on `port`, trusting the certificates in `ca` (PEM) or else the
/// system's store.
pub(crate) fn establish(
    host: &str,
    port: u16,
    ca: Option<&Path>,
    protocol: nts::Protocol,
    aeads: &[nts::Aead],
    timeout: Duration,
) -> Result<Established> {
    establish_with(&client_config(ca)?, host, port, protocol, aeads, timeout)
}

/// The TLS 1.3 client configuration of NTS-KE (ALPN `ntske/1`), trusting the certificates in `ca`
/// (PEM) or else the system's store.
pub(crate) fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("--nts-ca {}", path.display()))?
            {
                let cert = cert.with_context(|| format!("--nts-ca {}", path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("--nts-ca {}", path.display()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A certificate the parser cannot use is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        bail!("no trusted certificates (give --nts-ca FILE)");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![nts::ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// The association's keys, exported from the TLS session as `answer` agreed.
pub(crate) fn export_keys(
    conn: &ClientConnection,
    answer: &KeAnswer,
) -> Result<Keys, rustls::Error> {
    answer.agreement.export_keys(|context, key| {
        conn.export_keying_material(key, nts::EXPORTER_LABEL, Some(context))
            .map(drop)
    })
}

/// An error of the TLS session with the NTS-KE server at `addr`, as the operator can act on it: a
/// certificate this client does not trust is said to be one, with the flag that trusts it.
fn tls_error(e: &std::io::Error, addr: std::net::SocketAddr) -> anyhow::Error {
    let rejected = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    let Some(rustls::Error::InvalidCertificate(why)) = rejected else {
        return anyhow::anyhow!("NTS-KE {addr}: {e}");
    };
    let why = match why {
        rustls::CertificateError::UnknownIssuer => "signed by an issuer not trusted here".into(),
        rustls::CertificateError::NotValidForName
        | rustls::CertificateError::NotValidForNameContext { .. } => {
            "not made out to the name asked for".into()
        }
        rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. } => {
            "expired".into()
        }
        // The rest by the variant's name, without the bytes rustls adds.
        other => format!("{other:?}")
            .split([' ', '(', '{'])
            .next()
            .unwrap_or("")
            .to_owned(),
    };
    anyhow::anyhow!(
        "NTS-KE {addr}: the server's certificate is not trusted ({why}): if it is your own \
         server's, give --nts-ca FILE with the certificate that signed it"
    )
}

/// [`establish`] with a configuration made once by [`client_config`], offering `protocol` and
/// `aeads`.
pub(crate) fn establish_with(
    config: &Arc<ClientConfig>,
    host: &str,
    port: u16,
    protocol: nts::Protocol,
    aeads: &[nts::Aead],
    timeout: Duration,
) -> Result<Established> {
    let name = ServerName::try_from(host.to_owned())
        .with_context(|| format!("{host}: not a server name"))?;
    let ke_addr = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("{host}: cannot resolve"))?
        .next()
        .with_context(|| format!("{host}: no address"))?;
    let tcp = TcpStream::connect_timeout(&ke_addr, timeout)
        .with_context(|| format!("NTS-KE {ke_addr}: cannot connect"))?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    let conn = ClientConnection::new(config.clone(), name)?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(&nts::ke_request(protocol, aeads))
        .map_err(|e| tls_error(&e, ke_addr))?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    let len = loop {
        if let Some(len) = nts::ke_message_len(&response) {
            break len;
        }
        if response.len() > 65536 {
            bail!("NTS-KE {ke_addr}: response longer than 64 KiB");
        }
        let n = match tls.read(&mut chunk) {
            Ok(n) => n,
            Err(e) => return Err(tls_error(&e, ke_addr)),
        };
        if n == 0 {
            bail!("NTS-KE {ke_addr}: closed before End of Message");
        }
        response.extend_from_slice(&chunk[..n]);
    };
    let answer = nts::parse_ke_response(&response[..len], protocol, aeads)
        .with_context(|| format!("NTS-KE {ke_addr}"))?;
    let keys =
        export_keys(&tls.conn, &answer).with_context(|| format!("NTS-KE {ke_addr}: key export"))?;
    let ntp_host = answer.server.clone().unwrap_or_else(|| host.to_owned());
    let ntp_port = answer.port.unwrap_or(123);
    let ntp = (ntp_host.as_str(), ntp_port)
        .to_socket_addrs()
        .with_context(|| format!("{ntp_host}: cannot resolve the NTP server NTS-KE named"))?
        .next()
        .with_context(|| format!("{ntp_host}: no address"))?;
    Ok(Established { keys, answer, ntp })
}
