//! The backends the run requires were run. The other tests run every backend the CPU has and
//! skip the rest, so on a machine without AVX-512 its kernel is never run; CI names the backends
//! its machines have in `CHIME_SHA512_REQUIRE` (comma-separated: `avx512`, `avx2`, `portable`),
//! and this fails when one of them was not run here.

use chime_sha512::Backend;

#[test]
fn every_required_backend_runs_here() {
    let available = Backend::available();
    eprintln!("SHA-512 backends the tests run on this CPU: {available:?}");
    let Ok(required) = std::env::var("CHIME_SHA512_REQUIRE") else {
        eprintln!("CHIME_SHA512_REQUIRE is not set: no backend is required");
        return;
    };
    for name in required.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let backend = match name {
            "avx512" => Backend::Avx512,
            "avx2" => Backend::Avx2,
            "portable" => Backend::Portable,
            other => {
                panic!("CHIME_SHA512_REQUIRE: {other:?} is no backend (avx512, avx2, portable)")
            }
        };
        assert!(
            available.contains(&backend),
            "CHIME_SHA512_REQUIRE requires {name}, which this CPU does not run: its kernel's tests \
             did not run (the CPU runs {available:?})"
        );
    }
}
