//! `chime perf roughtime`: Roughtime requests of a chosen version, matched by nonce, with the
//! reply's signatures and Merkle path verified on a sample (`--verify-every N`).
//!
//! Each request is one template (built once, 1024 bytes) with the id written into the first 8
//! bytes of its nonce; the rest of the nonce is random per run. So the request a reply answers can
//! be rebuilt from the id alone when that reply is picked for full verification, and nothing is
//! stored per request beyond what the worker keeps for every protocol.

use chime_roughtime::{Reply, VerifyPolicy, Version, build_request, srv_value, verify_reply};

use super::args::LoadArgs;
use super::protocol::{LoadProtocol, ReplyMatch, Signed, Verdict};
use crate::roughtime::{parse_key, parse_version};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("server").required(true).args(["target"])))]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) load: LoadArgs,

    /// The server's long-term public key (base64 or hex), for verifying replies
    #[arg(long, value_name = "KEY", value_parser = parse_key_arg)]
    pub(crate) public_key: [u8; 32],

    /// Protocol version of the requests: 1 (RFC 10049), 0x8000000c, or 0x8000000b..0x80000008
    #[arg(long = "version", value_name = "V", default_value = "1", value_parser = parse_perf_version)]
    pub(crate) version: Version,

    /// Verify the signatures and path of every Nth matched reply (1: all; 0: none); the others
    /// are only parsed and matched
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) verify_every: u64,

    /// Over TCP (RFC 10049 §4) instead of UDP: --tcp-connections per thread, reused with
    /// requests pipelined, or a new connection per request
    #[arg(long)]
    pub(crate) tcp: bool,

    /// With --tcp: connections per thread, each request on the next in turn; 0 opens a new
    /// connection for every request and closes it once the reply is in (the handshake is then
    /// in every round trip)
    #[arg(long, value_name = "N", default_value_t = 4, requires = "tcp",
          value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub(crate) tcp_connections: u64,
}

fn parse_key_arg(s: &str) -> Result<[u8; 32], String> {
    parse_key(s).map_err(|e| format!("{e:#}"))
}

fn parse_perf_version(s: &str) -> Result<Version, String> {
    match parse_version(s)? {
        // Google's replies carry no NONC: a reply can only be matched to its request by trying
        // the Merkle path against every request in flight.
        Version::Google => Err("google: replies carry no nonce to match them by".into()),
        v => Ok(v),
    }
}

/// Roughtime requests of one version.
#[derive(Clone, Debug)]
pub(crate) struct RoughtimeLoad {
    template: Vec<u8>,
    /// Where the nonce starts in the template; the id is its first 8 bytes.
    nonce_at: usize,
    public_key: [u8; 32],
    /// Bytes per Merkle path entry in this version's replies (32, or Google's 64).
    hash_len: usize,
    verify_every: u64,
    matched: u64,
    policy: VerifyPolicy,
    scratch: Vec<u8>,
}

impl RoughtimeLoad {
    pub(crate) fn new(version: Version, public_key: [u8; 32], verify_every: u64) -> Self {
        let nonce: [u8; 32] = rand::random();
        let mut template = vec![0u8; chime_roughtime::REQUEST_LEN];
        let srv = srv_value(&public_key);
        let len = build_request(
            &mut template,
            &[version],
            &nonce,
            version.has_srv().then_some(&srv),
        )
        .expect("a single supported version always builds");
        template.truncate(len);
        let nonce_at = template
            .windows(nonce.len())
            .position(|w| w == nonce)
            .expect("the nonce is in the request");
        Self {
            scratch: template.clone(),
            template,
            nonce_at,
            public_key,
            hash_len: version.family().hash_len(),
            verify_every,
            matched: 0,
            // Load tests need no radius cap: the point is that the signature holds.
            policy: VerifyPolicy::new(u64::MAX),
        }
    }

    fn request_for(&mut self, id: u64) -> &[u8] {
        self.scratch.copy_from_slice(&self.template);
        self.scratch[self.nonce_at..self.nonce_at + 8].copy_from_slice(&id.to_le_bytes());
        &self.scratch
    }
}

impl LoadProtocol for RoughtimeLoad {
    const NAME: &'static str = "roughtime";

    fn max_request_len(&self) -> usize {
        self.template.len()
    }

    fn max_reply_len(&self) -> usize {
        // A reply is never larger than its request; take more to see a broken one whole.
        4096
    }

    fn fill_request(&mut self, id: u64, buf: &mut [u8]) -> usize {
        let len = self.template.len();
        buf[..len].copy_from_slice(self.request_for(id));
        len
    }

    fn match_reply(&mut self, reply: &[u8], _received_unix_secs: i64) -> ReplyMatch {
        let Ok(parsed) = Reply::parse(reply) else {
            return ReplyMatch::Unmatched;
        };
        let Some(nonce) = parsed.nonce.filter(|n| n.len() >= 8) else {
            return ReplyMatch::Unmatched;
        };
        let mut id_bytes = [0u8; 8];
        id_bytes.copy_from_slice(&nonce[..8]);
        let id = u64::from_le_bytes(id_bytes);
        // The rest of the nonce must be this run's: anything else is not an answer to us.
        if nonce[8..] != self.template[self.nonce_at + 8..self.nonce_at + nonce.len()] {
            return ReplyMatch::Unmatched;
        }
        self.matched += 1;
        // Saturating: a path longer than 255 hashes is invalid anyway, and verification says so.
        let path_len = u8::try_from(parsed.path.len() / self.hash_len).unwrap_or(u8::MAX);
        let mut verdict = Verdict::Valid;
        let mut verified = false;
        if self.verify_every > 0 && self.matched.is_multiple_of(self.verify_every) {
            let key = self.public_key;
            let policy = self.policy;
            let request = self.request_for(id);
            match verify_reply(request, reply, &key, &policy) {
                Ok(_) => verified = true,
                Err(_) => verdict = Verdict::Invalid,
            }
        }
        ReplyMatch::Matched {
            id,
            verdict,
            server: None,
            signed: Some(Signed { verified, path_len }),
        }
    }
}

#[cfg(test)]
mod tests {
    use chime_roughtime::{
        BatchParams, Exchange, LongTermKey, OnlineKey, Responder, ResponderConfig,
    };

    use super::*;

    fn answer(key: &LongTermKey, request: &[u8]) -> Vec<u8> {
        let d = key
            .delegate(OnlineKey::from_seed(&[2; 32]), 0, u64::MAX / 2_000_000)
            .unwrap();
        let mut responder = Responder::new(ResponderConfig::default());
        let mut reply = vec![0u8; request.len()];
        let mut ex = [Exchange::new(request, &mut reply)];
        let params = BatchParams {
            now_unix_us: 1_790_000_000_000_000,
            radius_us: 1000,
            delegation: &d,
        };
        responder.respond(params, &mut ex);
        let n = ex[0].outcome().unwrap().unwrap();
        reply.truncate(n);
        reply
    }

    #[test]
    fn replies_match_their_request_and_verify() {
        let key = LongTermKey::from_seed(&[1; 32]);
        for version in [
            Version::Rfc10049,
            Version::Draft12,
            Version::Draft11,
            Version::Draft08,
            Version::Draft07,
        ] {
            let mut load = RoughtimeLoad::new(version, key.public_key(), 1);
            let mut buf = vec![0u8; 2048];
            let n = load.fill_request(0xDEAD_BEEF, &mut buf);
            let reply = answer(&key, &buf[..n]);
            let m = load.match_reply(&reply, 0);
            assert_eq!(
                m,
                ReplyMatch::Matched {
                    id: 0xDEAD_BEEF,
                    verdict: Verdict::Valid,
                    server: None,
                    signed: Some(Signed {
                        verified: true,
                        path_len: 0
                    }),
                },
                "{version}"
            );
            // A reply under another key matches but fails verification.
            let mut wrong = RoughtimeLoad::new(version, [9; 32], 1);
            wrong.template = load.template.clone();
            wrong.nonce_at = load.nonce_at;
            let m = wrong.match_reply(&reply, 0);
            assert!(
                matches!(
                    m,
                    ReplyMatch::Matched {
                        verdict: Verdict::Invalid,
                        ..
                    }
                ),
                "{m:?}"
            );
        }
    }

    #[test]
    fn foreign_nonces_do_not_match() {
        let key = LongTermKey::from_seed(&[1; 32]);
        let mut ours = RoughtimeLoad::new(Version::Rfc10049, key.public_key(), 0);
        let mut theirs = RoughtimeLoad::new(Version::Rfc10049, key.public_key(), 0);
        let mut buf = vec![0u8; 2048];
        let n = theirs.fill_request(7, &mut buf);
        let reply = answer(&key, &buf[..n]);
        assert_eq!(ours.match_reply(&reply, 0), ReplyMatch::Unmatched);
        assert_eq!(ours.match_reply(b"garbage", 0), ReplyMatch::Unmatched);
    }
}
