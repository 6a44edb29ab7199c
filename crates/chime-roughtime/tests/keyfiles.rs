//! The committed sample of each Roughtime key file (`testdata/keyfiles/`, written by `chime
//! keygen`'s and `chime delegate`'s encoders from patterned test seeds) still reads as the keys it
//! was made from, and writing those keys again gives the same bytes: the formats do not drift.

use chime_roughtime::{Bundle, LongTermKey, encode_key_file, parse_key_file};

const ED25519: &str = include_str!("../testdata/keyfiles/ed25519.key");
const BUNDLE: &str = include_str!("../testdata/keyfiles/bundle");

/// The sample bundle's first window opens here; its two windows are a day apart, two days long.
const BUNDLE_START: u64 = 1_795_000_000;

#[test]
fn the_ed25519_sample_reads_and_writes_back_byte_for_byte() {
    let seed = parse_key_file(ED25519).unwrap();
    assert_eq!(*seed, [0x11; 32]);
    assert_eq!(*encode_key_file(&seed), ED25519);
}

#[test]
fn the_bundle_sample_reads_and_writes_back_byte_for_byte() {
    let bundle = Bundle::parse(BUNDLE).unwrap();
    let key = LongTermKey::from_seed(&[0x11; 32]);
    assert_eq!(bundle.long_term_public_key(), key.public_key());
    let windows: Vec<(u64, u64)> = bundle
        .windows()
        .iter()
        .map(|d| (d.mint_unix_s(), d.maxt_unix_s()))
        .collect();
    let day = 86_400;
    let expected: Vec<(u64, u64)> = (0..windows.len() as u64)
        .map(|i| (BUNDLE_START + i * day, BUNDLE_START + (i + 2) * day))
        .collect();
    assert_eq!(windows, expected);
    assert_eq!(windows.len(), 2, "{windows:?}");
    assert_eq!(*bundle.encode(), BUNDLE);
}

#[cfg(feature = "mldsa")]
#[test]
fn the_mldsa44_sample_reads_and_writes_back_byte_for_byte() {
    use chime_roughtime::mldsa;
    let text = include_str!("../testdata/keyfiles/mldsa44.key");
    let seed = mldsa::parse_key_file(text).unwrap();
    assert_eq!(*seed, [0x22; 32]);
    assert_eq!(*mldsa::encode_key_file(&seed), text);
}
