//! Helpers shared by the integration tests: reading the vectors in `testdata/`.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

/// The IETF interop harness's long-term seed (testdata/README.md).
pub(crate) const INTEROP_SEED_HEX: &str =
    "06e5e2dc28697bb363de00976af2d422819bc67832ad655ade96081ecc1bcdb5";
/// Its public key.
pub(crate) const INTEROP_PUBLIC_HEX: &str =
    "231bbb82a8c9f5353a231b0ef30c59c40153e6d7ba15c65942ae6f5c5977e491";

pub(crate) fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

pub(crate) fn read(name: &str) -> Vec<u8> {
    std::fs::read(testdata(name)).unwrap_or_else(|e| panic!("testdata/{name}: {e}"))
}

pub(crate) fn json(name: &str) -> Value {
    serde_json::from_slice(&read(name)).unwrap_or_else(|e| panic!("testdata/{name}: {e}"))
}

pub(crate) fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

pub(crate) fn hex32(s: &str) -> [u8; 32] {
    hex(s).try_into().expect("32 bytes")
}

pub(crate) fn b64(s: &str) -> Vec<u8> {
    STANDARD.decode(s).expect("base64")
}

pub(crate) fn b64_32(s: &str) -> [u8; 32] {
    b64(s).try_into().expect("32 bytes")
}

pub(crate) fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("missing string {key}"))
}

pub(crate) fn u64_field(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("missing number {key}"))
}

/// A request/reply pair from a vector file; `reply` is `None` where the server stayed silent.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    /// Where it came from, for failure messages.
    pub(crate) origin: String,
    pub(crate) request: Vec<u8>,
    pub(crate) reply: Option<Vec<u8>>,
    /// The long-term public key the reply is signed with, where documented.
    pub(crate) public_key: Option<[u8; 32]>,
}

/// Every exchange in the JSON vector files signed by the interop key.
pub(crate) fn json_exchanges() -> Vec<Captured> {
    let interop = hex32(INTEROP_PUBLIC_HEX);
    let mut out = Vec::new();
    for (i, e) in json("captured-single.json")
        .as_array()
        .expect("array")
        .iter()
        .enumerate()
    {
        out.push(Captured {
            origin: format!("captured-single.json[{i}] {}", str_field(e, "server")),
            request: hex(str_field(e, "request_hex")),
            reply: Some(hex(str_field(e, "response_hex"))),
            public_key: Some(hex32(str_field(e, "root_public_key_hex"))),
        });
    }
    for file in [
        "roughenough-batch16-v1.json",
        "roughtimed-batch16-0x8000000c.json",
        "tannerryan-batch8-0x8000000c.json",
    ] {
        for (i, e) in json(file).as_array().expect("array").iter().enumerate() {
            out.push(Captured {
                origin: format!("{file}[{i}]"),
                request: hex(str_field(e, "request_hex")),
                reply: Some(hex(str_field(e, "response_hex"))),
                public_key: Some(interop),
            });
        }
    }
    out
}

/// The three exchanges of RFC 10049 Appendix B, with their `rand` values.
pub(crate) fn appendix_b() -> Vec<(Captured, Option<[u8; 32]>)> {
    json("draft19-appendixB-malfeasance.json")["responses"]
        .as_array()
        .expect("responses")
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let c = Captured {
                origin: format!("appendix B response {i}"),
                request: b64(str_field(r, "request")),
                reply: Some(b64(str_field(r, "response"))),
                public_key: Some(b64_32(str_field(r, "publicKey"))),
            };
            (c, r["rand"].as_str().map(b64_32))
        })
        .collect()
}

/// The roughenough-protocol fixtures: (request, reply, public key).
pub(crate) fn fixture_exchanges() -> Vec<Captured> {
    vec![
        Captured {
            origin: "rfc10049-*.104172a3".into(),
            request: read("rfc10049-request.104172a3"),
            reply: Some(read("rfc10049-response.104172a3")),
            public_key: Some(b64_32("GX9rI+FshTLGq8g4+s1ep4m+DHaykgM0A5v6iz02jWE=")),
        },
        Captured {
            origin: "rfc-*.071039e5".into(),
            request: read("rfc-request.071039e5"),
            reply: Some(read("rfc-response.071039e5")),
            public_key: Some(b64_32("AW5uAoTSTDfG5NfY1bTh08GUnOqlRb+HVhbJ3ODJvsE=")),
        },
    ]
}

/// UDP payloads of a classic little-endian pcap with Ethernet framing, with their ports.
pub(crate) fn pcap_datagrams(name: &str) -> Vec<(u16, u16, Vec<u8>)> {
    let b = read(name);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xa1b2_c3d4, "microsecond pcap");
    assert_eq!(u32_at(20), 1, "DLT_EN10MB");
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= b.len() {
        let incl = u32_at(off + 8) as usize;
        let frame = &b[off + 16..off + 16 + incl];
        off += 16 + incl;
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        let (proto, l4) = match ethertype {
            0x0800 => (frame[14 + 9], 14 + usize::from(frame[14] & 0x0f) * 4),
            0x86dd => (frame[14 + 6], 14 + 40),
            _ => continue,
        };
        if proto != 17 {
            continue;
        }
        let port = |o: usize| u16::from_be_bytes([frame[l4 + o], frame[l4 + o + 1]]);
        let len = usize::from(port(4));
        out.push((port(0), port(2), frame[l4 + 8..l4 + len].to_vec()));
    }
    out
}

/// The pcap's client requests, each with the server's reply if there was one.
pub(crate) fn pcap_exchanges() -> Vec<Captured> {
    const SERVER_PORTS: [u16; 5] = [2002, 2003, 2004, 2005, 5319];
    let datagrams = pcap_datagrams("interop-matrix.pcap");
    let interop = hex32(INTEROP_PUBLIC_HEX);
    let mut out = Vec::new();
    for (i, (src, dst, payload)) in datagrams.iter().enumerate() {
        if !SERVER_PORTS.contains(dst) {
            continue;
        }
        let reply = datagrams[i + 1..]
            .iter()
            .find(|(s, d, _)| s == dst && d == src)
            .map(|(_, _, p)| p.clone());
        out.push(Captured {
            origin: format!("interop-matrix.pcap #{i} {src}->{dst}"),
            request: payload.clone(),
            reply,
            public_key: Some(interop),
        });
    }
    out
}
