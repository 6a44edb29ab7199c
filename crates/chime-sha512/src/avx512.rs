//! Eight lanes in AVX-512F registers. The 64-bit rotate (`vprorq`) and three-input logic
//! (`vpternlogq`: 0x96 is a three-way XOR, 0xCA is Ch, 0xE8 is Maj) keep a round near the scalar
//! instruction count, eight times over.

use std::arch::x86_64::{
    __m512i, _mm256_extract_epi64, _mm512_add_epi64, _mm512_extracti64x4_epi64, _mm512_ror_epi64,
    _mm512_set_epi64, _mm512_set1_epi64, _mm512_srli_epi64, _mm512_ternarylogic_epi64,
};

type V = __m512i;
const WIDTH: usize = 8;

crate::kernel::lanes_kernel!("avx512f");

#[target_feature(enable = "avx512f")]
#[inline]
fn add(a: V, b: V) -> V {
    _mm512_add_epi64(a, b)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn splat(k: u64) -> V {
    _mm512_set1_epi64(k as i64)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn ch(e: V, f: V, g: V) -> V {
    _mm512_ternarylogic_epi64::<0xCA>(e, f, g)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn maj(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi64::<0xE8>(a, b, c)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn xor3(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi64::<0x96>(a, b, c)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn big_sigma0(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<28>(x),
        _mm512_ror_epi64::<34>(x),
        _mm512_ror_epi64::<39>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn big_sigma1(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<14>(x),
        _mm512_ror_epi64::<18>(x),
        _mm512_ror_epi64::<41>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn small_sigma0(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<1>(x),
        _mm512_ror_epi64::<8>(x),
        _mm512_srli_epi64::<7>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn small_sigma1(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<19>(x),
        _mm512_ror_epi64::<61>(x),
        _mm512_srli_epi64::<6>(x),
    )
}

#[target_feature(enable = "avx512f")]
#[inline]
fn gather(word: impl Fn(usize) -> u64) -> V {
    let w = |j| word(j) as i64;
    _mm512_set_epi64(w(7), w(6), w(5), w(4), w(3), w(2), w(1), w(0))
}

#[target_feature(enable = "avx512f")]
#[inline]
fn scatter(v: V) -> [u64; WIDTH] {
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
