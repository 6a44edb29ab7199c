//! Where to send a query, as a person writes it on the command line.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use anyhow::{Context, Result};

/// `server` resolved to one address: `ADDR:PORT`, `[IPV6]:PORT`, an address alone (`192.0.2.1`,
/// `2001:db8::1`, `[2001:db8::1]`), `HOST:PORT` or `HOST`, the port `default_port` where none is
/// given. A name resolving to several addresses gives the first.
pub(crate) fn resolve(server: &str, default_port: u16) -> Result<SocketAddr> {
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = server
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(server);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok((ip, default_port).into());
    }
    let spec = if server.contains(':') {
        server.to_owned()
    } else {
        format!("{server}:{default_port}")
    };
    spec.to_socket_addrs()
        .with_context(|| format!("{server}: cannot resolve"))?
        .next()
        .with_context(|| format!("{server}: no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_of_writing_an_address_resolves() {
        for (written, expected) in [
            ("192.0.2.1", "192.0.2.1:123"),
            ("192.0.2.1:4123", "192.0.2.1:4123"),
            ("::1", "[::1]:123"),
            ("[::1]", "[::1]:123"),
            ("[::1]:4123", "[::1]:4123"),
            ("localhost:4123", "127.0.0.1:4123"),
        ] {
            let got = resolve(written, 123).unwrap_or_else(|e| panic!("{written}: {e:#}"));
            assert_eq!(got, expected.parse().unwrap(), "{written}");
        }
        assert!(resolve("[::1", 123).is_err());
        assert!(resolve("192.0.2.1:99999", 123).is_err());
    }
}
