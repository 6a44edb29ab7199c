//! Four lanes in AVX2 registers, for CPUs without AVX-512. AVX2 has neither a 64-bit rotate nor
//! three-input logic, so a rotate is two shifts and an OR and Ch and Maj take three operations
//! each; still about twice the throughput of one message at a time.

use std::arch::x86_64::__m256i;

use pulp::x86::V3;

type V = __m256i;
const WIDTH: usize = 4;

/// The AVX2 operations a round needs, on a token that proves the CPU has them (x86-64-v3, which
/// every AVX2 CPU is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Isa(pub(crate) V3);

crate::kernel::lanes_kernel!();

impl Isa {
    /// `x` rotated right by `R` bits; `L` must be `64 - R` (const generics cannot say so).
    #[inline(always)]
    fn ror<const R: i32, const L: i32>(self, x: V) -> V {
        let avx2 = self.0.avx2;
        avx2._mm256_or_si256(
            avx2._mm256_srli_epi64::<R>(x),
            avx2._mm256_slli_epi64::<L>(x),
        )
    }

    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        self.0.avx2._mm256_add_epi64(a, b)
    }

    #[inline(always)]
    fn splat(self, k: u64) -> V {
        self.0.avx._mm256_set1_epi64x(k as i64)
    }

    #[inline(always)]
    fn ch(self, e: V, f: V, g: V) -> V {
        let avx2 = self.0.avx2;
        avx2._mm256_xor_si256(avx2._mm256_and_si256(e, f), avx2._mm256_andnot_si256(e, g))
    }

    #[inline(always)]
    fn maj(self, a: V, b: V, c: V) -> V {
        // (a & b) | (c & (a | b)): the same bits as the three-way majority.
        let avx2 = self.0.avx2;
        avx2._mm256_or_si256(
            avx2._mm256_and_si256(a, b),
            avx2._mm256_and_si256(c, avx2._mm256_or_si256(a, b)),
        )
    }

    #[inline(always)]
    fn xor3(self, a: V, b: V, c: V) -> V {
        let avx2 = self.0.avx2;
        avx2._mm256_xor_si256(avx2._mm256_xor_si256(a, b), c)
    }

    #[inline(always)]
    fn big_sigma0(self, x: V) -> V {
        self.xor3(
            self.ror::<28, 36>(x),
            self.ror::<34, 30>(x),
            self.ror::<39, 25>(x),
        )
    }

    #[inline(always)]
    fn big_sigma1(self, x: V) -> V {
        self.xor3(
            self.ror::<14, 50>(x),
            self.ror::<18, 46>(x),
            self.ror::<41, 23>(x),
        )
    }

    #[inline(always)]
    fn small_sigma0(self, x: V) -> V {
        let shifted = self.0.avx2._mm256_srli_epi64::<7>(x);
        self.xor3(self.ror::<1, 63>(x), self.ror::<8, 56>(x), shifted)
    }

    #[inline(always)]
    fn small_sigma1(self, x: V) -> V {
        let shifted = self.0.avx2._mm256_srli_epi64::<6>(x);
        self.xor3(self.ror::<19, 45>(x), self.ror::<61, 3>(x), shifted)
    }

    #[inline(always)]
    fn gather(self, word: impl Fn(usize) -> u64) -> V {
        let w = |j| word(j) as i64;
        self.0.avx._mm256_set_epi64x(w(3), w(2), w(1), w(0))
    }

    #[inline(always)]
    fn load_block(self, stage: &[[u8; crate::STAGE_BYTES]; WIDTH], at: usize) -> [V; 16] {
        let mut w = [self.splat(0); 16];
        for (t, w) in w.iter_mut().enumerate() {
            *w = self.gather(|j| {
                let word = &stage[j][at + 8 * t..at + 8 * t + 8];
                u64::from_be_bytes(word.try_into().unwrap_or([0; 8]))
            });
        }
        w
    }

    #[inline(always)]
    fn scatter(self, v: V) -> [u64; WIDTH] {
        pulp::cast(v)
    }
}
