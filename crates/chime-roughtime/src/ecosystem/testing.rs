//! What the ecosystem's tests share: a seeded random source, made-up lists, and a network of our
//! own servers with chosen clock offsets.

use base64::Engine as _;

use super::list::{ListedServer, ServerAddress, ServerList, Transport};
use super::measure::Chain;
use crate::client::VerifyPolicy;
use crate::keys::{LongTermKey, OnlineKey};
use crate::server::{BatchParams, Exchange, Responder, ResponderConfig};

pub(super) const NOW_US: u64 = 1_795_285_217_000_000;

/// SplitMix64: a seeded stand-in for the caller's random source.
pub(super) fn seeded(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn key(b64: &str) -> [u8; 32] {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
        .try_into()
        .unwrap()
}

/// A list of `n` servers named `s0`, `s1`, … with made-up keys.
pub(super) fn list_of(n: usize) -> ServerList {
    ServerList {
        servers: (0..n)
            .map(|i| ListedServer {
                name: format!("s{i}"),
                version: None,
                public_key: [i as u8; 32],
                addresses: vec![ServerAddress {
                    transport: Transport::Udp,
                    address: format!("s{i}.example:2002"),
                }],
            })
            .collect(),
        sources: Vec::new(),
        reports: None,
    }
}

/// Our own servers, each with a clock offset in seconds, and the list naming them.
pub(super) struct Net {
    pub(super) keys: Vec<LongTermKey>,
    pub(super) offsets_s: Vec<i64>,
    pub(super) list: ServerList,
    pub(super) step: u64,
}

impl Net {
    pub(super) fn new(offsets_s: &[i64]) -> Self {
        let keys: Vec<LongTermKey> = (0..offsets_s.len())
            .map(|i| LongTermKey::from_seed(&[i as u8 + 1; 32]))
            .collect();
        let servers: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let b64 = base64::engine::general_purpose::STANDARD.encode(k.public_key());
                format!(
                    r#"{{"name":"s{i}","publicKeyType":"ed25519","publicKey":"{b64}","addresses":[{{"protocol":"udp","address":"192.0.2.{i}:2002"}}]}}"#
                )
            })
            .collect();
        let list = ServerList::parse(&format!(r#"{{"servers":[{}]}}"#, servers.join(","))).unwrap();
        assert_eq!(list.servers[0].public_key, key(&base64_key(&keys[0])));
        Self {
            keys,
            offsets_s: offsets_s.to_vec(),
            list,
            step: 0,
        }
    }

    /// Server `i`'s reply to `request`, 10 ms after the last one.
    pub(super) fn reply(&mut self, i: usize, request: &[u8]) -> Vec<u8> {
        self.step += 1;
        let now_us = NOW_US
            .checked_add_signed(self.offsets_s[i] * 1_000_000)
            .unwrap()
            + self.step * 10_000;
        let delegation = self.keys[i]
            .delegate(OnlineKey::from_seed(&[i as u8 ^ 0xff; 32]), 0, u64::MAX / 2)
            .unwrap();
        let mut reply = vec![0u8; request.len()];
        let mut ex = [Exchange::new(request, &mut reply)];
        Responder::new(ResponderConfig::default()).respond(
            BatchParams {
                now_unix_us: now_us,
                radius_us: 1_000_000,
                delegation: &delegation,
            },
            &mut ex,
        );
        let len = ex[0].outcome().unwrap().unwrap();
        reply.truncate(len);
        reply
    }
}

pub(super) fn base64_key(k: &LongTermKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(k.public_key())
}

/// Drives `chain` to the end; `dead(server, pass)` says who stays silent.
pub(super) fn drive<R: FnMut() -> u64>(
    chain: &mut Chain<'_, R>,
    net: &mut Net,
    mut dead: impl FnMut(usize, usize) -> bool,
) -> Vec<usize> {
    let mut asked = Vec::new();
    while let Some(query) = chain.next_query() {
        let server = query.server();
        let pass = asked.iter().filter(|s| **s == server).count();
        asked.push(server);
        if dead(server, pass) {
            query.no_answer();
        } else {
            let reply = net.reply(server, query.request());
            query.answer(&reply).unwrap();
        }
    }
    asked
}

pub(super) fn policy() -> VerifyPolicy {
    VerifyPolicy::new(10_000_000)
}
