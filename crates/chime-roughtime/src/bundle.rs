//! Delegation bundles: a long-term key's delegations made ahead of time for one server, so that
//! the server never holds the long-term key (RFC 10049's design, as roughtimed and Cloudflare's
//! servers run). Where the long-term key lives, [`make_bundle`] makes a series of online keys,
//! each certified for a window of time, consecutive windows overlapping so that the server always
//! has one with time left; the server reads the bundle ([`Bundle::parse`], which checks every
//! certificate against the long-term public key) and signs with [`Bundle::current`]. A stolen
//! server costs its own bundle, not the service's identity.
//!
//! Pure string and key work, through `chime-keyfile`: writing the file (mode 0600, never
//! overwritten) is the caller's. The text: `#` comments, blank lines, one `long-term-public HEX`
//! line first, then per window a `window MINT MAXT SEED` line (Unix seconds, the online key's seed
//! in hex) followed by one `cert HEX` line per version family, in [`Family::ALL`] order.

use chime_keyfile::{Field, KeyFileError, KeyFileWriter, KeyLine, key_lines};
use zeroize::Zeroizing;

use crate::keys::{
    CERT_LEN, Certificate, Delegation, DelegationError, KEY_LEN, LongTermKey, OnlineKey,
};
use crate::version::Family;

/// Which windows to make: from `start_unix_s` for `span_s` seconds, a new window every `step_s`,
/// each valid for `window_s` (more than `step_s`, so that consecutive windows overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundlePlan {
    /// When the first window opens (Unix seconds).
    pub start_unix_s: u64,
    /// How long the bundle covers, in seconds: the last window closes at or after the end.
    pub span_s: u64,
    /// Seconds from one window's opening to the next.
    pub step_s: u64,
    /// How long each window lasts; more than `step_s`.
    pub window_s: u64,
}

/// Why a bundle could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// The plan makes no windows or windows that do not overlap.
    #[error("{0}")]
    Plan(&'static str),
    /// The text is not what the format says.
    #[error(transparent)]
    Text(#[from] KeyFileError),
    /// A window's certificates do not verify under the long-term key, or its times do not match
    /// them.
    #[error("line {line}: {source}")]
    Window {
        /// The window's line, 1-based.
        line: usize,
        /// Why.
        source: DelegationError,
    },
}

/// A server's delegations, in the order of their windows.
#[derive(Clone)]
pub struct Bundle {
    long_term_public: [u8; KEY_LEN],
    windows: Vec<Delegation>,
}

impl std::fmt::Debug for Bundle {
    // The online keys are secret: the windows' times only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let windows: Vec<_> = self
            .windows
            .iter()
            .map(|d| (d.mint_unix_s(), d.maxt_unix_s()))
            .collect();
        f.debug_struct("Bundle")
            .field("windows", &windows)
            .finish_non_exhaustive()
    }
}

/// Makes the windows of `plan` under `key`, each with an online key from `seed` (fresh random
/// bytes from the caller: this crate reads no randomness).
pub fn make_bundle(
    key: &LongTermKey,
    plan: BundlePlan,
    mut seed: impl FnMut() -> [u8; KEY_LEN],
) -> Result<Bundle, BundleError> {
    if plan.span_s == 0 || plan.step_s == 0 {
        return Err(BundleError::Plan(
            "the span and the step must be more than 0 s",
        ));
    }
    if plan.window_s <= plan.step_s {
        return Err(BundleError::Plan(
            "each window must last longer than the step, so that consecutive windows overlap",
        ));
    }
    let end = plan.start_unix_s.saturating_add(plan.span_s);
    let mut windows = Vec::new();
    let mut mint = plan.start_unix_s;
    loop {
        let maxt = mint.saturating_add(plan.window_s);
        let online = OnlineKey::from_seed(&Zeroizing::new(seed()));
        // mint < maxt by the checks above.
        let d = key
            .delegate(online, mint, maxt)
            .map_err(|_| BundleError::Plan("a window is empty"))?;
        windows.push(d);
        if maxt >= end {
            break;
        }
        mint += plan.step_s;
    }
    Ok(Bundle {
        long_term_public: key.public_key(),
        windows,
    })
}

impl Bundle {
    /// The long-term public key every certificate verifies under.
    pub fn long_term_public_key(&self) -> [u8; KEY_LEN] {
        self.long_term_public
    }

    /// The delegations, in the order of their windows.
    pub fn windows(&self) -> &[Delegation] {
        &self.windows
    }

    /// The delegation to sign with at `unix_s`: of the windows that cover it, the one with the
    /// most time left. `None` outside every window: then nothing may be signed.
    pub fn current(&self, unix_s: u64) -> Option<&Delegation> {
        self.windows
            .iter()
            .filter(|d| d.covers(unix_s))
            .max_by_key(|d| d.maxt_unix_s())
    }

    /// Seconds from `unix_s` until the bundle runs out, counting overlapping windows as one
    /// stretch; 0 outside every window.
    pub fn seconds_left(&self, unix_s: u64) -> u64 {
        let mut until = match self.current(unix_s) {
            Some(d) => d.maxt_unix_s(),
            None => return 0,
        };
        // Windows are in order: follow each one that opens before the stretch closes.
        for d in &self.windows {
            if d.mint_unix_s() <= until.saturating_add(1) {
                until = until.max(d.maxt_unix_s());
            }
        }
        until - unix_s
    }

    /// The bundle as text (the format [`make_bundle`] writes); wiped when dropped, since it holds
    /// the online keys' seeds.
    pub fn encode(&self) -> Zeroizing<String> {
        let per_window = 2 * 8 * 3 + 2 * KEY_LEN + Family::COUNT * (6 + 2 * CERT_LEN);
        let mut file = KeyFileWriter::with_capacity(512 + self.windows.len() * per_window);
        file.comment(
            "chime Roughtime delegation bundle: online keys and the certificates the long-term",
        )
        .comment(
            "key signed for them, one window each. Keep it secret (mode 0600): whoever has it can",
        )
        .comment("sign as this server until its last window closes.")
        .line(&[
            Field::Word(LONG_TERM_PUBLIC),
            Field::Hex(&self.long_term_public),
        ]);
        for d in &self.windows {
            file.line(&[
                Field::Word(WINDOW),
                Field::Decimal(d.mint_unix_s().into()),
                Field::Decimal(d.maxt_unix_s().into()),
                Field::Hex(&*d.online_key().seed()),
            ]);
            for family in Family::ALL {
                file.line(&[
                    Field::Word(CERT),
                    Field::Hex(d.certificate(family).as_bytes()),
                ]);
            }
        }
        file.finish()
    }

    /// Reads a bundle's text and checks every certificate against the long-term public key, as
    /// a client would: a bundle that does not verify is refused whole.
    pub fn parse(text: &str) -> Result<Self, BundleError> {
        let mut lines = key_lines(text);
        let long_term_public = read_long_term_public(lines.next())?;
        let mut windows = Vec::new();
        let mut open: Option<OpenWindow> = None;
        for mut line in lines {
            match line.label() {
                WINDOW => {
                    let next = OpenWindow::read(line)?;
                    if let Some(done) = open.replace(next) {
                        windows.push(done.finish(long_term_public)?);
                    }
                }
                CERT => match &mut open {
                    Some(window) => window.read_cert(line)?,
                    None => return Err(line.invalid("a cert line before any window line").into()),
                },
                LONG_TERM_PUBLIC => return Err(line.repeated("`long-term-public`").into()),
                _ => {
                    return Err(line
                        .wrong_label("`window MINT MAXT SEED` or `cert HEX`")
                        .into());
                }
            }
        }
        if let Some(done) = open {
            windows.push(done.finish(long_term_public)?);
        }
        if windows.is_empty() {
            return Err(KeyFileError::Missing { what: "`window`" }.into());
        }
        Ok(Self {
            long_term_public,
            windows,
        })
    }
}

/// The labels of a bundle's lines.
const LONG_TERM_PUBLIC: &str = "long-term-public";
const WINDOW: &str = "window";
const CERT: &str = "cert";

/// The long-term public key from a bundle's first key line, which must be its.
fn read_long_term_public(first: Option<KeyLine<'_>>) -> Result<[u8; KEY_LEN], KeyFileError> {
    let mut line = first.ok_or(KeyFileError::Empty)?;
    if line.label() != LONG_TERM_PUBLIC {
        return Err(line.wrong_label("`long-term-public HEX` first"));
    }
    let public = *line.hex::<KEY_LEN>("the long-term public key")?;
    line.end("the long-term public key")?;
    Ok(public)
}

/// A window being read: its line, times and online key, and its certificates so far.
struct OpenWindow {
    line: usize,
    mint: u64,
    maxt: u64,
    online: OnlineKey,
    certs: Vec<Certificate>,
}

impl OpenWindow {
    /// The rest of a `window MINT MAXT SEED` line.
    fn read(mut line: KeyLine<'_>) -> Result<Self, KeyFileError> {
        let mint = line.decimal("MINT")?;
        let maxt = line.decimal("MAXT")?;
        let seed = line.hex::<KEY_LEN>("the online key's seed")?;
        let number = line.number();
        line.end("the online key's seed")?;
        Ok(Self {
            line: number,
            mint,
            maxt,
            online: OnlineKey::from_seed(&seed),
            certs: Vec::with_capacity(Family::COUNT),
        })
    }

    /// The rest of a `cert HEX` line.
    fn read_cert(&mut self, mut line: KeyLine<'_>) -> Result<(), KeyFileError> {
        let bytes = line.hex::<CERT_LEN>("the certificate")?;
        line.end("the certificate")?;
        self.certs.push(Certificate::from_bytes(*bytes));
        Ok(())
    }

    /// The window's delegation, once its certificates verify under `long_term_public`.
    fn finish(self, long_term_public: [u8; KEY_LEN]) -> Result<Delegation, BundleError> {
        let found = self.certs.len();
        let certs: [Certificate; Family::COUNT] =
            self.certs
                .try_into()
                .map_err(|_| KeyFileError::WrongCount {
                    line: self.line,
                    what: "`cert`",
                    found,
                    expected: Family::COUNT,
                })?;
        Delegation::from_certificates(self.online, certs, self.mint, self.maxt, long_term_public)
            .map_err(|source| BundleError::Window {
                line: self.line,
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    fn plan() -> BundlePlan {
        BundlePlan {
            start_unix_s: 1_795_000_000,
            span_s: 30 * DAY,
            step_s: DAY,
            window_s: 2 * DAY,
        }
    }

    fn seeds() -> impl FnMut() -> [u8; KEY_LEN] {
        let mut n = 0u8;
        move || {
            n = n.wrapping_add(1);
            [n; KEY_LEN]
        }
    }

    #[test]
    fn windows_leave_no_gap_and_overlap_over_the_span() {
        let key = LongTermKey::from_seed(&[7; KEY_LEN]);
        for (span, step, window) in [
            (30 * DAY, DAY, 2 * DAY),
            (DAY, 3600, 7200),
            (10, 3, 4),
            (5, 10, 11),
        ] {
            let p = BundlePlan {
                span_s: span,
                step_s: step,
                window_s: window,
                ..plan()
            };
            let b = make_bundle(&key, p, seeds()).unwrap();
            let w = b.windows();
            assert_eq!(w[0].mint_unix_s(), p.start_unix_s);
            assert!(w.last().unwrap().maxt_unix_s() >= p.start_unix_s + span);
            for pair in w.windows(2) {
                assert!(
                    pair[1].mint_unix_s() < pair[0].maxt_unix_s(),
                    "{p:?}: a gap"
                );
                assert!(pair[1].mint_unix_s() > pair[0].mint_unix_s());
            }
            // Every second of the span has a window, with time left until the bundle's end.
            for t in (p.start_unix_s..=p.start_unix_s + span).step_by((span / 97).max(1) as usize) {
                let d = b
                    .current(t)
                    .unwrap_or_else(|| panic!("{p:?}: nothing at {t}"));
                assert!(d.covers(t));
                assert_eq!(b.seconds_left(t), w.last().unwrap().maxt_unix_s() - t);
            }
            // Each window has its own online key.
            let mut keys: Vec<_> = w.iter().map(|d| d.online_public_key()).collect();
            keys.dedup();
            assert_eq!(keys.len(), w.len());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Any plan whose windows overlap: no gap from its start to its end, a window covering
        /// every second of it, and every certificate verifying under the long-term key for its
        /// version family (reading the written bundle back checks each as a client would).
        #[test]
        fn any_overlapping_plan_covers_its_span_and_verifies(
            start in 0u64..4_000_000_000,
            step in 1u64..=600,
            count in 1u64..=12,
            extra in 1u64..=600,
        ) {
            let p = BundlePlan {
                start_unix_s: start,
                span_s: step * count,
                step_s: step,
                window_s: step + extra,
            };
            let key = LongTermKey::from_seed(&[3; KEY_LEN]);
            let b = make_bundle(&key, p, seeds()).unwrap();
            let w = b.windows();
            for pair in w.windows(2) {
                proptest::prop_assert!(pair[1].mint_unix_s() < pair[0].maxt_unix_s());
            }
            let end = start + p.span_s;
            for t in (start..=end).step_by((p.span_s / 50).max(1) as usize) {
                proptest::prop_assert!(b.current(t).is_some_and(|d| d.covers(t)), "{t}");
            }
            let read = Bundle::parse(&b.encode()).unwrap();
            let keys = |b: &Bundle| -> Vec<_> {
                b.windows().iter().map(|d| d.online_public_key()).collect()
            };
            proptest::prop_assert_eq!(keys(&read), keys(&b));
        }
    }

    #[test]
    fn outside_every_window_there_is_nothing_to_sign_with() {
        let key = LongTermKey::from_seed(&[7; KEY_LEN]);
        let b = make_bundle(&key, plan(), seeds()).unwrap();
        let first = plan().start_unix_s;
        let last = b.windows().last().unwrap().maxt_unix_s();
        assert!(b.current(first - 1).is_none());
        assert!(b.current(last + 1).is_none());
        assert_eq!(b.seconds_left(last + 1), 0);
        // Of two overlapping windows, the one with the most time left signs.
        let d = b.current(first + DAY + 10).unwrap();
        assert_eq!(d.mint_unix_s(), first + DAY);
    }

    #[test]
    fn plans_without_overlap_are_refused() {
        let key = LongTermKey::from_seed(&[7; KEY_LEN]);
        for p in [
            BundlePlan {
                window_s: DAY,
                ..plan()
            },
            BundlePlan {
                step_s: 0,
                ..plan()
            },
            BundlePlan {
                span_s: 0,
                ..plan()
            },
        ] {
            assert!(
                matches!(make_bundle(&key, p, seeds()), Err(BundleError::Plan(_))),
                "{p:?}"
            );
        }
    }

    #[test]
    fn a_bundle_round_trips_and_every_certificate_is_checked() {
        let key = LongTermKey::from_seed(&[7; KEY_LEN]);
        let b = make_bundle(
            &key,
            BundlePlan {
                span_s: 3 * DAY,
                ..plan()
            },
            seeds(),
        )
        .unwrap();
        let text = b.encode();
        let back = Bundle::parse(&text).unwrap();
        assert_eq!(back.long_term_public_key(), key.public_key());
        assert_eq!(back.windows().len(), b.windows().len());
        for (a, z) in b.windows().iter().zip(back.windows()) {
            assert_eq!(a.online_public_key(), z.online_public_key());
            assert_eq!(
                (a.mint_unix_s(), a.maxt_unix_s()),
                (z.mint_unix_s(), z.maxt_unix_s())
            );
            for f in Family::ALL {
                assert_eq!(a.certificate(f), z.certificate(f));
            }
            assert_eq!(z.srv(), &key.srv());
        }
        // Any flipped bit of any certificate, or another long-term key, is refused.
        let lines: Vec<&str> = text.lines().collect();
        let cert_lines: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("cert "))
            .collect();
        assert_eq!(cert_lines.len(), b.windows().len() * Family::COUNT);
        for &i in cert_lines.iter().step_by(3) {
            for pos in [5, 5 + 40, lines[i].len() - 1] {
                let mut changed: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
                let mut bytes = changed[i].clone().into_bytes();
                bytes[pos] = if bytes[pos] == b'0' { b'1' } else { b'0' };
                changed[i] = String::from_utf8(bytes).unwrap();
                let e = Bundle::parse(&changed.join("\n")).unwrap_err();
                assert!(matches!(e, BundleError::Window { .. }), "{e}");
            }
        }
        let other = LongTermKey::from_seed(&[8; KEY_LEN]).public_key();
        let swapped = text.replace(&hex::encode(key.public_key()), &hex::encode(other));
        assert!(
            Bundle::parse(&swapped)
                .unwrap_err()
                .to_string()
                .contains("does not verify")
        );
        // Windows moved in time no longer match their certificates.
        let first = plan().start_unix_s.to_string();
        let moved = text.replacen(
            &format!("window {first}"),
            &format!("window {}", plan().start_unix_s + 1),
            1,
        );
        assert!(Bundle::parse(&moved).is_err());
        let public = format!("long-term-public {}\n", hex::encode(key.public_key()));
        let window = format!("window 1 2 {}\n", "00".repeat(32));
        let no_certs = format!("line 2: 0 `cert` lines, not {}", Family::COUNT);
        let short_cert = format!(
            "line 3: the certificate is 2 hex digits, not {}",
            2 * CERT_LEN
        );
        for (bad, says) in [
            ("", "empty: no key line, only blank lines and comments"),
            (&public, "no `window` line"),
            ("frob\n", "line 1: expected `long-term-public HEX` first"),
            (
                &(public.clone() + "cert 00\n"),
                "line 2: a cert line before any window line",
            ),
            (
                &(public.clone() + "frob\n"),
                "line 2: expected `window MINT MAXT SEED` or `cert HEX`",
            ),
            (
                &(public.clone() + &public),
                "line 2: a second `long-term-public` line",
            ),
            (
                &(public.clone() + "window 1 2\n"),
                "line 2: the online key's seed is missing",
            ),
            (
                &(public.clone() + "window x 2 00\n"),
                "line 2: MINT is not a number",
            ),
            (&(public.clone() + &window), &no_certs),
            (&(public.clone() + &window + "cert 00\n"), &short_cert),
        ] {
            assert_eq!(Bundle::parse(bad).unwrap_err().to_string(), says, "{bad:?}");
        }
    }
}
