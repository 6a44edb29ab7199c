//! The eight-lane SHA-512 compression function on AVX-512F.
//!
//! Lane `j` of every register belongs to message `j`: `a`..`h` hold the eight working variables,
//! `w` the sixteen-word window of the message schedule. The round is FIPS 180-4 §6.4.2 word for
//! word; AVX-512F's 64-bit rotate (`vprorq`) and three-input logic (`vpternlogq`: 0x96 is a three-way
//! XOR, 0xCA is Ch, 0xE8 is Maj) keep it near the scalar instruction count, eight times over.

use std::arch::x86_64::{
    __m512i, _mm256_extract_epi64, _mm512_add_epi64, _mm512_extracti64x4_epi64, _mm512_ror_epi64,
    _mm512_set_epi64, _mm512_set1_epi64, _mm512_srli_epi64, _mm512_ternarylogic_epi64,
};

use crate::consts::K;
use crate::{BLOCK, LANES, STAGE_BYTES};

/// Compresses lane `j`'s first `blocks[j]` blocks of `stage[j]` into `states[j]`.
///
/// All lanes step through the blocks together, as many as the longest lane has; a lane that has
/// run out goes on over stale bytes of its own staging area, and its state was taken out when its
/// last block was done.
#[target_feature(enable = "avx512f")]
pub(crate) fn compress(
    states: &mut [[u64; 8]; LANES],
    stage: &[[u8; STAGE_BYTES]; LANES],
    blocks: &[usize; LANES],
) {
    let rounds = blocks.iter().copied().max().unwrap_or(0);
    let mut state: [__m512i; 8] = std::array::from_fn(|i| gather(|j| states[j][i]));
    for b in 0..rounds {
        let at = b * BLOCK;
        let mut w: [__m512i; 16] = std::array::from_fn(|t| {
            gather(|j| {
                let word = &stage[j][at + 8 * t..at + 8 * t + 8];
                u64::from_be_bytes(word.try_into().unwrap_or([0; 8]))
            })
        });
        block(&mut state, &mut w);
        if blocks.contains(&(b + 1)) {
            let words = state.map(|v| scatter(v));
            for (j, out) in states.iter_mut().enumerate() {
                if blocks[j] == b + 1 {
                    *out = std::array::from_fn(|i| words[i][j]);
                }
            }
        }
    }
}

/// One block: 80 rounds over `w`, then the Davies–Meyer feed-forward into `state`.
#[target_feature(enable = "avx512f")]
#[inline]
fn block(state: &mut [__m512i; 8], w: &mut [__m512i; 16]) {
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
    for (r, k) in K.chunks_exact(16).enumerate() {
        for t in 0..16 {
            if r > 0 {
                // w[t] is W[i-16]; the others are W[i-15], W[i-7] and W[i-2] in the window.
                let s0 = small_sigma0(w[(t + 1) % 16]);
                let s1 = small_sigma1(w[(t + 14) % 16]);
                w[t] = _mm512_add_epi64(
                    _mm512_add_epi64(w[t], s0),
                    _mm512_add_epi64(w[(t + 9) % 16], s1),
                );
            }
            let kw = _mm512_add_epi64(w[t], _mm512_set1_epi64(k[t] as i64));
            let ch = _mm512_ternarylogic_epi64::<0xCA>(e, f, g);
            let t1 = _mm512_add_epi64(_mm512_add_epi64(h, big_sigma1(e)), _mm512_add_epi64(ch, kw));
            let maj = _mm512_ternarylogic_epi64::<0xE8>(a, b, c);
            let t2 = _mm512_add_epi64(big_sigma0(a), maj);
            h = g;
            g = f;
            f = e;
            e = _mm512_add_epi64(d, t1);
            d = c;
            c = b;
            b = a;
            a = _mm512_add_epi64(t1, t2);
        }
    }
    for (s, v) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
        *s = _mm512_add_epi64(*s, v);
    }
}

#[target_feature(enable = "avx512f")]
#[inline]
fn big_sigma0(x: __m512i) -> __m512i {
    xor3(
        _mm512_ror_epi64::<28>(x),
        _mm512_ror_epi64::<34>(x),
        _mm512_ror_epi64::<39>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn big_sigma1(x: __m512i) -> __m512i {
    xor3(
        _mm512_ror_epi64::<14>(x),
        _mm512_ror_epi64::<18>(x),
        _mm512_ror_epi64::<41>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn small_sigma0(x: __m512i) -> __m512i {
    xor3(
        _mm512_ror_epi64::<1>(x),
        _mm512_ror_epi64::<8>(x),
        _mm512_srli_epi64::<7>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn small_sigma1(x: __m512i) -> __m512i {
    xor3(
        _mm512_ror_epi64::<19>(x),
        _mm512_ror_epi64::<61>(x),
        _mm512_srli_epi64::<6>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(a, b, c)
}

/// A register whose lane `j` is `word(j)`.
#[target_feature(enable = "avx512f")]
#[inline]
fn gather(word: impl Fn(usize) -> u64) -> __m512i {
    let w = |j| word(j) as i64;
    _mm512_set_epi64(w(7), w(6), w(5), w(4), w(3), w(2), w(1), w(0))
}

/// The eight lanes of a register, lane 0 first.
#[target_feature(enable = "avx512f")]
#[inline]
fn scatter(v: __m512i) -> [u64; 8] {
    let (lo, hi) = (
        _mm512_extracti64x4_epi64::<0>(v),
        _mm512_extracti64x4_epi64::<1>(v),
    );
    [
        _mm256_extract_epi64::<0>(lo) as u64,
        _mm256_extract_epi64::<1>(lo) as u64,
        _mm256_extract_epi64::<2>(lo) as u64,
        _mm256_extract_epi64::<3>(lo) as u64,
        _mm256_extract_epi64::<0>(hi) as u64,
        _mm256_extract_epi64::<1>(hi) as u64,
        _mm256_extract_epi64::<2>(hi) as u64,
        _mm256_extract_epi64::<3>(hi) as u64,
    ]
}
