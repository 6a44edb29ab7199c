//! The committed samples of the NTS fleet secret file (`testdata/keyfiles/`: one as `chime
//! nts-fleet-key`'s encoder writes it from a patterned test secret, one with the `previous` line
//! an operator adds while replacing a secret) still read as the secrets they hold, and writing the
//! secret again gives the same bytes.

use chime_ntp::nts::{FleetSecret, encode_fleet_file, parse_fleet_file};

const FLEET: &str = include_str!("../testdata/keyfiles/fleet.key");
const FLEET_PREVIOUS: &str = include_str!("../testdata/keyfiles/fleet-previous.key");

#[test]
fn the_fleet_sample_reads_and_writes_back_byte_for_byte() {
    let (secret, previous) = parse_fleet_file(FLEET).unwrap();
    assert_eq!(secret, FleetSecret([0x44; 32]));
    assert!(previous.is_none());
    assert_eq!(*encode_fleet_file(&secret), FLEET);
}

#[test]
fn the_sample_with_a_previous_secret_reads() {
    let (secret, previous) = parse_fleet_file(FLEET_PREVIOUS).unwrap();
    assert_eq!(secret, FleetSecret([0x44; 32]));
    assert_eq!(previous, Some(FleetSecret([0x77; 32])));
}
