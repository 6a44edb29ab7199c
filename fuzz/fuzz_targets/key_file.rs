//! Key files: every kind's reader takes any text without panicking, and what reads writes back to
//! the same keys; the codec's own lines, written back word for word or as hex, read the same.
#![no_main]

use chime_keyfile::{Field, KeyFileWriter, key_lines};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    kinds_round_trip(text);
    lines_round_trip(text);
});

/// Each kind of key file: parse -> encode -> parse gives the same keys.
fn kinds_round_trip(text: &str) {
    if let Ok(seed) = chime_roughtime::parse_key_file(text) {
        let again = chime_roughtime::encode_key_file(&seed);
        assert_eq!(*chime_roughtime::parse_key_file(&again).unwrap(), *seed);
    }
    if let Ok((secret, _)) = chime_ntp::nts::parse_fleet_file(text) {
        let again = chime_ntp::nts::encode_fleet_file(&secret);
        assert_eq!(
            chime_ntp::nts::parse_fleet_file(&again).unwrap(),
            (secret, None)
        );
    }
    if let Ok(bundle) = chime_roughtime::Bundle::parse(text) {
        let again = chime_roughtime::Bundle::parse(&bundle.encode()).unwrap();
        assert_eq!(*again.encode(), *bundle.encode());
    }
}

/// The codec: every key line written back word for word reads as the same words, and every word
/// of 32 bytes of hex written back through `Field::Hex` decodes to the same bytes.
fn lines_round_trip(text: &str) {
    let mut file = KeyFileWriter::new();
    let mut read: Vec<Vec<&str>> = Vec::new();
    for mut line in key_lines(text) {
        let words: Vec<&str> =
            std::iter::from_fn(|| Some(line.label()).filter(|w| !w.is_empty())).collect();
        let fields: Vec<Field<'_>> = words.iter().map(|w| Field::Word(w)).collect();
        file.line(&fields);
        read.push(words);
    }
    let written = file.finish();
    let again: Vec<Vec<String>> = key_lines(&written)
        .map(|mut line| {
            std::iter::from_fn(|| Some(line.label().to_owned()).filter(|w| !w.is_empty())).collect()
        })
        .collect();
    assert_eq!(again, read);
    for mut line in key_lines(text) {
        let Ok(bytes) = line.hex::<32>("a word") else {
            continue;
        };
        let mut file = KeyFileWriter::new();
        file.line(&[Field::Hex(&*bytes)]);
        let written = file.finish();
        let mut back = key_lines(&written).next().unwrap();
        assert_eq!(*back.hex::<32>("a word").unwrap(), *bytes);
    }
}
