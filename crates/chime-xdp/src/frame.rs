//! Reading a UDP request out of a raw Ethernet frame, and turning the frame into its reply in
//! place: the Ethernet, IP and UDP headers swapped end for end, lengths and checksums made anew.
//!
//! Safe code over byte slices, so it is tested (and fuzzed) without a network. The XDP program
//! already passed only plain frames; this checks everything again, since a frame here that is not
//! what it claims (a bad checksum, a length that does not add up) must be dropped and counted,
//! never answered.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_UDP: u8 = 17;
/// The hop limit of replies, as Linux's default (`net.ipv4.ip_default_ttl`).
const REPLY_TTL: u8 = 64;

/// Why a frame was dropped instead of answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Shorter than its headers, or lengths in the headers that do not fit the frame.
    Length,
    /// Not plain IPv4 or IPv6 UDP (a protocol, version, option or fragment the program should
    /// have passed to the kernel).
    NotPlainUdp,
    /// The IPv4 header checksum or the UDP checksum is wrong.
    Checksum,
}

/// A UDP datagram found in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The client: where the reply goes.
    pub(crate) src: SocketAddr,
    /// The address and port it was sent to: where the reply comes from.
    pub(crate) dst: SocketAddr,
    /// The payload's offset in the frame, and its length.
    pub(crate) payload: (usize, usize),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Adds `data` to a ones'-complement sum as big-endian 16-bit words (an odd last byte padded with
/// zero, as RFC 1071 says).
///
/// The bulk is summed as native little-endian 32-bit words, which the compiler vectorises: a
/// 32-bit word is its two 16-bit halves modulo 0xffff, and a ones'-complement sum of byte-swapped
/// words is the byte-swapped sum (RFC 1071 §2(B)), so folding and swapping gives the big-endian
/// sum. Roughtime's requests are 1 KiB: this is on the hot path of every one.
fn sum(acc: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(4);
    let mut native: u64 = 0;
    for w in &mut words {
        native += u64::from(u32::from_le_bytes(w.try_into().expect("4 bytes")));
    }
    // Fold to 16 bits (each step keeps the value modulo 0xffff), then swap to big-endian.
    while native > 0xffff {
        native = (native & 0xffff) + (native >> 16);
    }
    let mut acc = acc + u64::from((native as u16).swap_bytes());
    let mut rest = words.remainder().chunks_exact(2);
    for w in &mut rest {
        acc += u64::from(be16(w, 0));
    }
    if let [last] = rest.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a sum to 16 bits and complements it: the checksum field's value.
fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The UDP checksum's pseudo-header sum.
fn pseudo(src: IpAddr, dst: IpAddr, udp_len: usize) -> u64 {
    let acc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum(sum(0, &s.octets()), &d.octets()),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum(sum(0, &s.octets()), &d.octets()),
        _ => unreachable!("one family per datagram"),
    };
    acc + udp_len as u64 + u64::from(PROTO_UDP)
}

/// Finds the UDP datagram in `frame`, checking every length and checksum.
pub(crate) fn parse(frame: &[u8]) -> Result<Request, Malformed> {
    if frame.len() < ETH_LEN + IPV4_LEN + UDP_LEN {
        return Err(Malformed::Length);
    }
    let (src_ip, dst_ip, udp_at, udp_room) = match be16(frame, 12) {
        ETHERTYPE_IPV4 => {
            let ip = &frame[ETH_LEN..];
            if ip[0] != 0x45 || ip[9] != PROTO_UDP || be16(ip, 6) & 0x3fff != 0 {
                return Err(Malformed::NotPlainUdp);
            }
            let total = usize::from(be16(ip, 2));
            if total < IPV4_LEN + UDP_LEN || total > ip.len() {
                return Err(Malformed::Length);
            }
            if fold(sum(0, &ip[..IPV4_LEN])) != 0 {
                return Err(Malformed::Checksum);
            }
            let s = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let d = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (
                IpAddr::V4(s),
                IpAddr::V4(d),
                ETH_LEN + IPV4_LEN,
                total - IPV4_LEN,
            )
        }
        ETHERTYPE_IPV6 => {
            if frame.len() < ETH_LEN + IPV6_LEN + UDP_LEN {
                return Err(Malformed::Length);
            }
            let ip = &frame[ETH_LEN..];
            if ip[0] >> 4 != 6 || ip[6] != PROTO_UDP {
                return Err(Malformed::NotPlainUdp);
            }
            let payload = usize::from(be16(ip, 4));
            if payload < UDP_LEN || payload > ip.len() - IPV6_LEN {
                return Err(Malformed::Length);
            }
            let s: [u8; 16] = ip[8..24].try_into().expect("16 bytes");
            let d: [u8; 16] = ip[24..40].try_into().expect("16 bytes");
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                ETH_LEN + IPV6_LEN,
                payload,
            )
        }
        _ => return Err(Malformed::NotPlainUdp),
    };
    let udp = &frame[udp_at..];
    let udp_len = usize::from(be16(udp, 4));
    if udp_len < UDP_LEN || udp_len > udp_room {
        return Err(Malformed::Length);
    }
    let stated = be16(udp, 6);
    // Zero means "no checksum", which only IPv4 allows.
    if (stated != 0 || src_ip.is_ipv6())
        && fold(sum(pseudo(src_ip, dst_ip, udp_len), &udp[..udp_len])) != 0
    {
        return Err(Malformed::Checksum);
    }
    Ok(Request {
        src: SocketAddr::new(src_ip, be16(udp, 0)),
        dst: SocketAddr::new(dst_ip, be16(udp, 2)),
        payload: (udp_at + UDP_LEN, udp_len - UDP_LEN),
    })
}

/// Turns `frame`, which held `req`, into the reply carrying the `len` payload bytes already
/// written at the request's payload offset: the MAC addresses, IP addresses and ports swapped,
/// lengths set, a fresh hop limit, and both checksums computed. Returns the reply frame's length.
pub(crate) fn make_reply(frame: &mut [u8], req: &Request, len: usize) -> usize {
    let (off, _) = req.payload;
    let (eth, rest) = frame.split_at_mut(ETH_LEN);
    let (dst_mac, src_mac) = eth.split_at_mut(6);
    dst_mac.swap_with_slice(&mut src_mac[..6]);
    let udp_len = UDP_LEN + len;
    let ip_len = off - ETH_LEN - UDP_LEN;
    let (ip, rest) = rest.split_at_mut(ip_len);
    match (req.dst.ip(), req.src.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&((IPV4_LEN + udp_len) as u16).to_be_bytes());
            // Identification 0 and Don't Fragment, as Linux sends a datagram that fits.
            ip[4..8].copy_from_slice(&[0, 0, 0x40, 0]);
            ip[8] = REPLY_TTL;
            ip[9] = PROTO_UDP;
            ip[10..12].fill(0);
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = fold(sum(0, &ip[..IPV4_LEN]));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = PROTO_UDP;
            ip[7] = REPLY_TTL;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
        }
        _ => unreachable!("one family per datagram"),
    }
    let udp = &mut rest[..udp_len];
    udp[0..2].copy_from_slice(&req.dst.port().to_be_bytes());
    udp[2..4].copy_from_slice(&req.src.port().to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].fill(0);
    let c = fold(sum(pseudo(req.dst.ip(), req.src.ip(), udp_len), udp));
    // A computed zero is sent as all ones: zero would mean "no checksum".
    let c = if c == 0 { 0xffff } else { c };
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    off + len
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A frame carrying `payload` from `src` to `dst`, with correct checksums.
    pub(crate) fn frame(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
        // Build it as a reply from `dst` to `src` of a request that never was: make_reply is
        // what writes headers. The MAC addresses come out swapped, so write them swapped first.
        let off = ETH_LEN + if src.is_ipv4() { IPV4_LEN } else { IPV6_LEN } + UDP_LEN;
        let mut f = vec![0u8; off + payload.len()];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        let ethertype = if src.is_ipv4() {
            ETHERTYPE_IPV4
        } else {
            ETHERTYPE_IPV6
        };
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[off..].copy_from_slice(payload);
        let fake = Request {
            src: dst,
            dst: src,
            payload: (off, payload.len()),
        };
        let n = make_reply(&mut f, &fake, payload.len());
        assert_eq!(n, f.len());
        f
    }

    fn v4(a: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port)
    }

    fn v6(last: u16, port: u16) -> SocketAddr {
        SocketAddr::new(
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)),
            port,
        )
    }

    #[test]
    fn the_checksum_is_rfc1071s() {
        // RFC 1071's worked example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(0, &data)), !0xddf2);
        // An odd length pads with zero, and the word path agrees with the byte path.
        assert_eq!(fold(sum(0, &[0xab])), !0xab00);
        // Against a plain byte-by-byte RFC 1071 sum, at every length and alignment up to 80
        // bytes, with words that carry.
        let data: Vec<u8> = (0..200u32).map(|i| (i * 97 + 13) as u8 | 0x80).collect();
        for start in 0..4 {
            for len in 0..80 {
                let d = &data[start..start + len];
                let plain: u64 = d
                    .chunks(2)
                    .map(|w| (u64::from(w[0]) << 8) | w.get(1).map_or(0, |&b| u64::from(b)))
                    .sum();
                assert_eq!(fold(sum(0, d)), fold(plain), "{len} bytes from {start}");
            }
        }
        assert_eq!(fold(sum(0, &[0xff; 1024])), fold(512 * 0xffff));
    }

    #[test]
    fn a_request_parses_and_its_reply_goes_back_from_where_it_was_sent() {
        for (client, server) in [
            (v4([192, 0, 2, 7], 40000), v4([198, 51, 100, 1], 123)),
            (v6(7, 40000), v6(1, 2002)),
        ] {
            let mut f = frame(client, server, &[0x23; 48]);
            let req = parse(&f).unwrap();
            assert_eq!((req.src, req.dst), (client, server));
            assert_eq!(&f[req.payload.0..][..req.payload.1], &[0x23; 48]);
            // A shorter reply, in place.
            f[req.payload.0..][..20].fill(0x24);
            let n = make_reply(&mut f, &req, 20);
            let reply = parse(&f[..n]).unwrap();
            assert_eq!((reply.src, reply.dst), (server, client));
            assert_eq!(reply.payload.1, 20);
            assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 1]);
        }
    }

    #[test]
    fn a_corrupted_frame_is_refused() {
        let good = frame(v4([192, 0, 2, 7], 1), v4([192, 0, 2, 1], 123), &[1; 48]);
        assert!(parse(&good).is_ok());
        // One payload bit flipped: the UDP checksum no longer holds.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(parse(&bad), Err(Malformed::Checksum));
        // A header bit flipped: the IPv4 checksum no longer holds.
        let mut bad = good.clone();
        bad[ETH_LEN + 8] ^= 1;
        assert_eq!(parse(&bad), Err(Malformed::Checksum));
        // IP options, a fragment, TCP.
        for (at, value) in [(ETH_LEN, 0x46), (ETH_LEN + 6, 0x20), (ETH_LEN + 9, 6)] {
            let mut bad = good.clone();
            bad[at] = value;
            assert_eq!(parse(&bad), Err(Malformed::NotPlainUdp), "byte {at}");
        }
        // Cut short, and a UDP length past the IP length.
        for n in 0..good.len() - 48 {
            assert!(parse(&good[..n]).is_err(), "{n} bytes");
        }
        let mut bad = good.clone();
        bad[ETH_LEN + IPV4_LEN + 4] = 0xff;
        assert_eq!(parse(&bad), Err(Malformed::Length));
        // IPv6 without a checksum.
        let mut bad = frame(v6(7, 1), v6(1, 123), &[1; 48]);
        bad[ETH_LEN + IPV6_LEN + 6..][..2].fill(0);
        assert_eq!(parse(&bad), Err(Malformed::Checksum));
    }
}
