//! SHA-512 of up to eight independent messages at once.
//!
//! One SHA-512 is a chain of dependent rounds, but different messages do not depend on each
//! other, so eight of them fit the eight 64-bit lanes of an AVX-512 register: every instruction
//! advances all eight. A Roughtime batch is exactly that workload, one SHA-512 of a 1 KiB request
//! per Merkle leaf, then a level of inner nodes at a time.
//!
//! [`Lanes`] stages up to [`LANES`] messages, each given as the concatenation of a few parts (a
//! Merkle leaf is `0x00 ‖ request`), pads them as FIPS 180-4 says, and [`Lanes::finish`] hashes
//! them together. On a CPU short of x86-64-v4's AVX-512 (checked at run time) four lanes go
//! through AVX2 at a time, and without AVX2 (x86-64-v3) the same staged blocks go one lane at a
//! time through the `sha2` crate's compression function; all paths share the staging and padding,
//! and every test runs on every backend the CPU has.
//!
//! Running code compiled for AVX-512 or AVX2 is sound only on a CPU that has it. The `pulp` crate
//! carries that proof: its CPU-feature tokens exist only once the features were seen at run time,
//! its intrinsics are safe methods on them, and it runs a kernel in a function compiled for the
//! token's features. So this crate, like every crate but the socket layer, has no code the
//! compiler cannot check; the kernels are written once (`kernel.rs`) for both backends.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod consts;
#[cfg(target_arch = "x86_64")]
mod kernel;

use sha2::digest::generic_array::GenericArray;

/// Messages hashed together.
pub const LANES: usize = 8;

/// SHA-512 blocks a lane can stage.
const STAGE_BLOCKS: usize = 16;

/// Bytes of one SHA-512 block.
const BLOCK: usize = 128;

/// Bytes of a lane's staging area.
const STAGE_BYTES: usize = STAGE_BLOCKS * BLOCK;

/// The longest message a lane takes: its padding (0x80 and a 16-byte length) must fit too.
pub const MAX_MESSAGE_LEN: usize = STAGE_BYTES - 17;

/// Which member of the SHA-512 family a [`Lanes`] computes. They share everything but the initial
/// hash value; SHA-512/256's digest is the first 32 bytes of what [`Lanes::finish`] hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Variant {
    /// SHA-512.
    #[default]
    Sha512,
    /// SHA-512/256 (FIPS 180-4 §5.3.6.2), which Roughtime's draft 07 hashes its tree with.
    Sha512_256,
}

impl Variant {
    const fn iv(self) -> [u64; 8] {
        match self {
            Self::Sha512 => consts::IV,
            Self::Sha512_256 => consts::IV_512_256,
        }
    }
}

/// How [`Lanes::finish`] computes the digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// Eight lanes in AVX-512 registers, on an x86-64-v4 CPU (AVX-512F, BW, CD, DQ and VL).
    Avx512,
    /// Four lanes at a time in AVX2 registers, on an x86-64-v3 CPU.
    Avx2,
    /// One lane at a time through `sha2::compress512`.
    Portable,
}

impl Backend {
    /// The fastest backend this CPU runs.
    pub fn detect() -> Self {
        Self::available()[0]
    }

    /// Every backend this CPU runs, fastest first (for tests and benchmarks).
    pub fn available() -> &'static [Backend] {
        #[cfg(target_arch = "x86_64")]
        match (
            pulp::x86::V4::try_new().is_some(),
            pulp::x86::V3::try_new().is_some(),
        ) {
            (true, true) => return &[Backend::Avx512, Backend::Avx2, Backend::Portable],
            (true, false) => return &[Backend::Avx512, Backend::Portable],
            (false, true) => return &[Backend::Avx2, Backend::Portable],
            (false, false) => {}
        }
        &[Backend::Portable]
    }
}

/// Up to [`LANES`] padded messages waiting to be hashed together.
///
/// Allocates once, in [`Lanes::new`]; staging and hashing never touch the allocator.
#[derive(Clone)]
pub struct Lanes {
    stage: Box<[[u8; STAGE_BYTES]; LANES]>,
    /// Padded length of each staged message, in blocks.
    blocks: [usize; LANES],
    used: usize,
    kernel: Kernel,
    variant: Variant,
}

/// A backend, with the proof that this CPU runs it.
#[derive(Debug, Clone, Copy)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512(avx512::Isa),
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2::Isa),
    Portable,
}

impl Kernel {
    /// `backend`, or `None` if this CPU cannot run it.
    fn new(backend: Backend) -> Option<Self> {
        match backend {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => pulp::x86::V4::try_new().map(|simd| Self::Avx512(avx512::Isa(simd))),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => pulp::x86::V3::try_new().map(|simd| Self::Avx2(avx2::Isa(simd))),
            Backend::Portable => Some(Self::Portable),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn backend(self) -> Backend {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512(_) => Backend::Avx512,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(_) => Backend::Avx2,
            Self::Portable => Backend::Portable,
        }
    }
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("used", &self.used)
            .field("blocks", &&self.blocks[..self.used])
            .field("backend", &self.backend())
            .field("variant", &self.variant)
            .finish_non_exhaustive()
    }
}

impl Default for Lanes {
    fn default() -> Self {
        Self::new()
    }
}

impl Lanes {
    /// Empty lanes on the fastest backend this CPU runs.
    pub fn new() -> Self {
        Self {
            stage: Box::new([[0; STAGE_BYTES]; LANES]),
            blocks: [0; LANES],
            used: 0,
            kernel: Kernel::new(Backend::detect()).unwrap_or(Kernel::Portable),
            variant: Variant::Sha512,
        }
    }

    /// These lanes, computing `variant` from now on.
    pub fn with_variant(self, variant: Variant) -> Self {
        Self { variant, ..self }
    }

    /// What [`finish`](Self::finish) computes.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Empty lanes on `backend`, or `None` if this CPU cannot run it.
    pub fn with_backend(backend: Backend) -> Option<Self> {
        Some(Self {
            kernel: Kernel::new(backend)?,
            ..Self::new()
        })
    }

    /// The backend [`finish`](Self::finish) uses.
    pub fn backend(&self) -> Backend {
        self.kernel.backend()
    }

    /// Messages staged.
    pub fn len(&self) -> usize {
        self.used
    }

    /// True if nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// True if every lane is taken: [`finish`](Self::finish) before staging more.
    pub fn is_full(&self) -> bool {
        self.used == LANES
    }

    /// Stages the message made of `parts` one after the other and returns its lane, or `None`
    /// (staging nothing) if every lane is taken or the message is longer than
    /// [`MAX_MESSAGE_LEN`]; hash such a message on its own.
    pub fn push(&mut self, parts: &[&[u8]]) -> Option<usize> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.is_full() || len > MAX_MESSAGE_LEN {
            return None;
        }
        let lane = self.used;
        let stage = &mut self.stage[lane];
        let mut at = 0;
        for part in parts {
            stage[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        // FIPS 180-4 §5.1.2: 0x80, zeros, then the length in bits as a 128-bit big-endian number
        // ending a block.
        let blocks = (len + 17).div_ceil(BLOCK);
        let end = blocks * BLOCK;
        stage[len] = 0x80;
        stage[len + 1..end - 16].fill(0);
        stage[end - 16..end].copy_from_slice(&(len as u128 * 8).to_be_bytes());
        self.blocks[lane] = blocks;
        self.used += 1;
        Some(lane)
    }

    /// Drops whatever is staged, unhashed.
    pub fn clear(&mut self) {
        self.used = 0;
    }

    /// Hashes every staged message, calls `digest(lane, &output)` for each in lane order, and
    /// empties the lanes. The output is the SHA-512 digest, or for [`Variant::Sha512_256`] the
    /// final state whose first 32 bytes are the digest.
    pub fn finish(&mut self, mut digest: impl FnMut(usize, &[u8; 64])) {
        let used = std::mem::take(&mut self.used);
        if used == 0 {
            return;
        }
        let mut states = [self.variant.iv(); LANES];
        let mut blocks = self.blocks;
        // Lanes past `used` hold stale bytes; zero blocks means none of them is hashed.
        blocks[used..].fill(0);
        self.compress(&mut states, &blocks, used);
        for (lane, state) in states[..used].iter().enumerate() {
            let mut out = [0u8; 64];
            for (chunk, word) in out.chunks_exact_mut(8).zip(state) {
                chunk.copy_from_slice(&word.to_be_bytes());
            }
            digest(lane, &out);
        }
    }

    /// Runs lane `i`'s first `blocks[i]` staged blocks through the compression function, starting
    /// from `states[i]`; `used` lanes hold messages.
    fn compress(&self, states: &mut [[u64; 8]; LANES], blocks: &[usize; LANES], used: usize) {
        // A pass over all lanes costs about what 1.6 (AVX-512) or 2 (AVX2) messages one by one
        // do, so a lone message goes alone.
        #[cfg(target_arch = "x86_64")]
        if used > 1 {
            match self.kernel {
                Kernel::Avx512(isa) => return isa.compress(states, &self.stage, blocks),
                Kernel::Avx2(isa) => return isa.compress(states, &self.stage, blocks),
                Kernel::Portable => {}
            }
        }
        for ((state, stage), &n) in states.iter_mut().zip(self.stage.iter()).zip(blocks) {
            for block in stage[..n * BLOCK].chunks_exact(BLOCK) {
                sha2::compress512(state, std::slice::from_ref(GenericArray::from_slice(block)));
            }
        }
    }
}

/// SHA-512 of the concatenation of `parts`, one message on its own (through `sha2`).
pub fn digest(parts: &[&[u8]]) -> [u8; 64] {
    use sha2::Digest;
    let mut sha = sha2::Sha512::new();
    for part in parts {
        sha.update(part);
    }
    sha.finalize().into()
}

/// SHA-512/256 of the concatenation of `parts`, one message on its own (through `sha2`).
pub fn digest_512_256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut sha = sha2::Sha512_256::new();
    for part in parts {
        sha.update(part);
    }
    sha.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// FIPS 180-4 example digests (NIST's "abc" and the two-block message).
    #[test]
    fn known_answers_on_every_backend() {
        let two_block = b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
        let cases: [(&[u8], &str); 3] = [
            (
                b"abc",
                "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
            ),
            (
                b"",
                "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e",
            ),
            (
                two_block,
                "8e959b75dae313da8cf4f72814fc143f8f7779c6eb9f7fa17299aeadb6889018501d289e4900f7e4331b99dec4b5433ac7d329eeb6dd26545e96e55b874be909",
            ),
        ];
        for &backend in Backend::available() {
            let mut lanes = Lanes::with_backend(backend).unwrap();
            for (message, _) in cases {
                lanes.push(&[message]).unwrap();
            }
            let mut got = Vec::new();
            lanes.finish(|lane, d| got.push((lane, hex(d))));
            let want: Vec<_> = cases
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c.1.into()))
                .collect();
            assert_eq!(got, want, "{backend:?}");
        }
    }

    /// SHA-512/256: NIST's "abc" and the empty message, then lengths across a block edge against
    /// `sha2`, in lanes on every backend.
    #[test]
    fn sha512_256_on_every_backend() {
        let known: [(&[u8], &str); 2] = [
            (
                b"abc",
                "53048e2681941ef99b2e29b76b4c7dabe4c2d0c634fc6d46e0e2f13107e7af23",
            ),
            (
                b"",
                "c672b8d1ef56ed28ab87c3622c5114069bdd3ad7b8f9737498d0c01ecef0967a",
            ),
        ];
        for (message, want) in known {
            assert_eq!(hex(&digest_512_256(&[message])), want);
        }
        let data: Vec<u8> = (0..300).map(|i| (i * 5 + 1) as u8).collect();
        for &backend in Backend::available() {
            let mut lanes = Lanes::with_backend(backend)
                .unwrap()
                .with_variant(Variant::Sha512_256);
            assert_eq!(lanes.variant(), Variant::Sha512_256);
            for lens in [
                &[3, 0][..],
                &[33, 65, 100, 111, 112, 113, 128, 240, 256][..8],
            ] {
                for &len in lens {
                    lanes.push(&[&data[..len]]).unwrap();
                }
                lanes.finish(|lane, out| {
                    assert_eq!(
                        out[..32],
                        digest_512_256(&[&data[..lens[lane]]]),
                        "{backend:?} len {}",
                        lens[lane]
                    );
                });
            }
        }
    }

    #[test]
    fn every_length_around_the_block_edges_in_every_lane() {
        for &backend in Backend::available() {
            let mut lanes = Lanes::with_backend(backend).unwrap();
            let data: Vec<u8> = (0..MAX_MESSAGE_LEN).map(|i| (i * 7 + 3) as u8).collect();
            // Every length from 0 to 300, then the edges of every block count up to the limit;
            // eight at a time, so each length lands in a different lane on each pass.
            let mut lengths: Vec<usize> = (0..=300).collect();
            for blocks in 3..=STAGE_BLOCKS {
                let edge = blocks * BLOCK - 17;
                lengths.extend(
                    [edge - 1, edge, edge + 1]
                        .into_iter()
                        .filter(|&l| l <= MAX_MESSAGE_LEN),
                );
            }
            for group in lengths.chunks(LANES - 1).chain(lengths.chunks(LANES)) {
                for &len in group {
                    lanes.push(&[&data[..len]]).unwrap();
                }
                let mut seen = 0;
                lanes.finish(|lane, d| {
                    assert_eq!(
                        *d,
                        digest(&[&data[..group[lane]]]),
                        "{backend:?} len {}",
                        group[lane]
                    );
                    seen += 1;
                });
                assert_eq!(seen, group.len());
                assert!(lanes.is_empty());
            }
        }
    }

    #[test]
    fn full_and_too_long_stage_nothing() {
        let mut lanes = Lanes::new();
        assert_eq!(lanes.push(&[&[0; MAX_MESSAGE_LEN + 1]]), None);
        assert_eq!(lanes.push(&[&[0; MAX_MESSAGE_LEN - 1], &[1, 2]]), None);
        assert!(lanes.is_empty());
        for lane in 0..LANES {
            assert_eq!(lanes.push(&[b"x"]), Some(lane));
        }
        assert!(lanes.is_full());
        assert_eq!(lanes.push(&[b"y"]), None);
        let mut n = 0;
        lanes.finish(|_, d| {
            assert_eq!(*d, digest(&[b"x"]));
            n += 1;
        });
        assert_eq!(n, LANES);
        lanes.finish(|_, _| panic!("nothing staged"));
        lanes.push(&[b"z"]).unwrap();
        lanes.clear();
        assert!(lanes.is_empty());
        lanes.finish(|_, _| panic!("cleared"));
    }

    proptest! {
        /// Any mix of lengths and part splits, on every backend, agrees with `sha2`.
        #[test]
        fn agrees_with_sha2(
            messages in prop::collection::vec(
                (prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN), any::<u16>(), any::<u16>()),
                1..=LANES,
            )
        ) {
            for &backend in Backend::available() {
                let mut lanes = Lanes::with_backend(backend).unwrap();
                for (m, x, y) in &messages {
                    let (i, j) = split_points(m.len(), *x, *y);
                    lanes.push(&[&m[..i], &m[i..j], &m[j..]]).unwrap();
                }
                let mut got = Vec::new();
                lanes.finish(|lane, d| got.push((lane, *d)));
                prop_assert_eq!(got.len(), messages.len());
                for (lane, d) in got {
                    prop_assert_eq!(d, digest(&[&messages[lane].0]), "{:?} lane {}", backend, lane);
                }
            }
        }
    }

    fn split_points(len: usize, x: u16, y: u16) -> (usize, usize) {
        let (a, b) = (x as usize % (len + 1), y as usize % (len + 1));
        (a.min(b), a.max(b))
    }

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }
}
