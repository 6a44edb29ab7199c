//! Eight lanes in AVX-512 registers. The 64-bit rotate (`vprorq`) and three-input logic
//! (`vpternlogq`: 0x96 is a three-way XOR, 0xCA is Ch, 0xE8 is Maj) keep a round near the scalar
//! instruction count, eight times over.
//!
//! A block's words arrive transposed: each lane's 128 bytes are read as two vectors of eight
//! words, byte-swapped in one shuffle (AVX-512BW's `vpshufb`), and an 8×8 transpose of 64-bit
//! elements (24 shuffles per half) turns them into the sixteen vectors that hold word `t` of every
//! lane. Assembling each of those vectors from eight scalar loads and byte swaps took about 430
//! instructions a block, against about 80.

use std::arch::x86_64::__m512i;

use pulp::x86::V4;

type V = __m512i;
const WIDTH: usize = 8;

/// The AVX-512 operations a round needs, on a token that proves the CPU has them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Isa(pub(crate) V4);

crate::kernel::lanes_kernel!();

impl Isa {
    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        self.0.avx512f._mm512_add_epi64(a, b)
    }

    #[inline(always)]
    fn splat(self, k: u64) -> V {
        self.0.avx512f._mm512_set1_epi64(k as i64)
    }

    #[inline(always)]
    fn ch(self, e: V, f: V, g: V) -> V {
        self.0.avx512f._mm512_ternarylogic_epi64::<0xCA>(e, f, g)
    }

    #[inline(always)]
    fn maj(self, a: V, b: V, c: V) -> V {
        self.0.avx512f._mm512_ternarylogic_epi64::<0xE8>(a, b, c)
    }

    #[inline(always)]
    fn xor3(self, a: V, b: V, c: V) -> V {
        self.0.avx512f._mm512_ternarylogic_epi64::<0x96>(a, b, c)
    }

    #[inline(always)]
    fn big_sigma0(self, x: V) -> V {
        self.xor3(
            self.0.avx512f._mm512_ror_epi64::<28>(x),
            self.0.avx512f._mm512_ror_epi64::<34>(x),
            self.0.avx512f._mm512_ror_epi64::<39>(x),
        )
    }

    #[inline(always)]
    fn big_sigma1(self, x: V) -> V {
        self.xor3(
            self.0.avx512f._mm512_ror_epi64::<14>(x),
            self.0.avx512f._mm512_ror_epi64::<18>(x),
            self.0.avx512f._mm512_ror_epi64::<41>(x),
        )
    }

    #[inline(always)]
    fn small_sigma0(self, x: V) -> V {
        self.xor3(
            self.0.avx512f._mm512_ror_epi64::<1>(x),
            self.0.avx512f._mm512_ror_epi64::<8>(x),
            self.0.avx512f._mm512_srli_epi64::<7>(x),
        )
    }

    #[inline(always)]
    fn small_sigma1(self, x: V) -> V {
        self.xor3(
            self.0.avx512f._mm512_ror_epi64::<19>(x),
            self.0.avx512f._mm512_ror_epi64::<61>(x),
            self.0.avx512f._mm512_srli_epi64::<6>(x),
        )
    }

    #[inline(always)]
    fn gather(self, word: impl Fn(usize) -> u64) -> V {
        let w = |j| word(j) as i64;
        self.0
            .avx512f
            ._mm512_set_epi64(w(7), w(6), w(5), w(4), w(3), w(2), w(1), w(0))
    }

    #[inline(always)]
    fn scatter(self, v: V) -> [u64; WIDTH] {
        pulp::cast(v)
    }

    #[inline(always)]
    fn load_block(self, stage: &[[u8; crate::STAGE_BYTES]; WIDTH], at: usize) -> [V; 16] {
        // Within each 64-bit element, byte 7 first: big-endian words from little-endian lanes.
        let swap = self.0.avx512f._mm512_set_epi64(
            0x08090a0b0c0d0e0f,
            0x0001020304050607,
            0x08090a0b0c0d0e0f,
            0x0001020304050607,
            0x08090a0b0c0d0e0f,
            0x0001020304050607,
            0x08090a0b0c0d0e0f,
            0x0001020304050607,
        );
        // Words 0..8 of every lane's block in `low`, words 8..16 in `high`, a lane to a vector.
        let (mut low, mut high) = ([swap; 8], [swap; 8]);
        for ((low, high), lane) in low.iter_mut().zip(&mut high).zip(stage) {
            *low = self.row(lane, at, swap);
            *high = self.row(lane, at + 64, swap);
        }
        let mut w = [swap; 16];
        w[..8].copy_from_slice(&self.transpose(low));
        w[8..].copy_from_slice(&self.transpose(high));
        w
    }

    /// The eight big-endian words at byte `start` of `lane`, word `i` in element `i`: one 64-byte
    /// load and one byte shuffle.
    #[inline(always)]
    fn row(self, lane: &[u8; crate::STAGE_BYTES], start: usize, swap: V) -> V {
        let bytes: [u8; 64] = lane
            .get(start..start + 64)
            .and_then(|bytes| bytes.try_into().ok())
            .unwrap_or([0; 64]);
        self.0.avx512bw._mm512_shuffle_epi8(pulp::cast(bytes), swap)
    }

    /// Element `t` of `rows[j]` becomes element `j` of vector `t`.
    #[inline(always)]
    fn transpose(self, rows: [V; 8]) -> [V; 8] {
        // `_mm512_set_epi64` lists elements from the highest; as index lists, element 0 first:
        // [0,1,8,9,4,5,12,13], [2,3,10,11,6,7,14,15], [0,1,2,3,8,9,10,11], [4,5,6,7,12,13,14,15].
        let f = self.0.avx512f;
        let even = f._mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
        let odd = f._mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
        let first = f._mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
        let second = f._mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
        // Pairs of rows: t[2p] has words 0, 2, 4, 6 of rows 2p and 2p+1 interleaved, t[2p+1] the
        // odd words.
        let t = [
            f._mm512_unpacklo_epi64(rows[0], rows[1]),
            f._mm512_unpackhi_epi64(rows[0], rows[1]),
            f._mm512_unpacklo_epi64(rows[2], rows[3]),
            f._mm512_unpackhi_epi64(rows[2], rows[3]),
            f._mm512_unpacklo_epi64(rows[4], rows[5]),
            f._mm512_unpackhi_epi64(rows[4], rows[5]),
            f._mm512_unpacklo_epi64(rows[6], rows[7]),
            f._mm512_unpackhi_epi64(rows[6], rows[7]),
        ];
        // Quads of rows: words 0 and 4, 2 and 6, 1 and 5, 3 and 7 of rows 0-3, then of rows 4-7.
        let u = [
            f._mm512_permutex2var_epi64(t[0], even, t[2]),
            f._mm512_permutex2var_epi64(t[0], odd, t[2]),
            f._mm512_permutex2var_epi64(t[1], even, t[3]),
            f._mm512_permutex2var_epi64(t[1], odd, t[3]),
            f._mm512_permutex2var_epi64(t[4], even, t[6]),
            f._mm512_permutex2var_epi64(t[4], odd, t[6]),
            f._mm512_permutex2var_epi64(t[5], even, t[7]),
            f._mm512_permutex2var_epi64(t[5], odd, t[7]),
        ];
        [
            f._mm512_permutex2var_epi64(u[0], first, u[4]),
            f._mm512_permutex2var_epi64(u[2], first, u[6]),
            f._mm512_permutex2var_epi64(u[1], first, u[5]),
            f._mm512_permutex2var_epi64(u[3], first, u[7]),
            f._mm512_permutex2var_epi64(u[0], second, u[4]),
            f._mm512_permutex2var_epi64(u[2], second, u[6]),
            f._mm512_permutex2var_epi64(u[1], second, u[5]),
            f._mm512_permutex2var_epi64(u[3], second, u[7]),
        ]
    }
}
