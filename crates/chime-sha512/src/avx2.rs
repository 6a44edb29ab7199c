//! Four lanes in AVX2 registers, for CPUs without AVX-512. AVX2 has neither a 64-bit rotate nor
//! three-input logic, so a rotate is two shifts and an OR and Ch and Maj take three operations
//! each; still about twice the throughput of one message at a time.

use std::arch::x86_64::{
    __m256i, _mm256_add_epi64, _mm256_and_si256, _mm256_andnot_si256, _mm256_extract_epi64,
    _mm256_or_si256, _mm256_set_epi64x, _mm256_set1_epi64x, _mm256_slli_epi64, _mm256_srli_epi64,
    _mm256_xor_si256,
};

type V = __m256i;
const WIDTH: usize = 4;

crate::kernel::lanes_kernel!("avx2");

/// `x` rotated right by `R` bits; `L` must be `64 - R` (const generics cannot say so).
#[target_feature(enable = "avx2")]
#[inline]
fn ror<const R: i32, const L: i32>(x: V) -> V {
    _mm256_or_si256(_mm256_srli_epi64::<R>(x), _mm256_slli_epi64::<L>(x))
}

#[target_feature(enable = "avx2")]
#[inline]
fn add(a: V, b: V) -> V {
    _mm256_add_epi64(a, b)
}

#[target_feature(enable = "avx2")]
#[inline]
fn splat(k: u64) -> V {
    _mm256_set1_epi64x(k as i64)
}

#[target_feature(enable = "avx2")]
#[inline]
fn ch(e: V, f: V, g: V) -> V {
    _mm256_xor_si256(_mm256_and_si256(e, f), _mm256_andnot_si256(e, g))
}

#[target_feature(enable = "avx2")]
#[inline]
fn maj(a: V, b: V, c: V) -> V {
    // (a & b) | (c & (a | b)): the same bits as the three-way majority.
    _mm256_or_si256(
        _mm256_and_si256(a, b),
        _mm256_and_si256(c, _mm256_or_si256(a, b)),
    )
}

#[target_feature(enable = "avx2")]
#[inline]
fn xor3(a: V, b: V, c: V) -> V {
    _mm256_xor_si256(_mm256_xor_si256(a, b), c)
}

#[target_feature(enable = "avx2")]
#[inline]
fn big_sigma0(x: V) -> V {
    xor3(ror::<28, 36>(x), ror::<34, 30>(x), ror::<39, 25>(x))
}

#[target_feature(enable = "avx2")]
#[inline]
fn big_sigma1(x: V) -> V {
    xor3(ror::<14, 50>(x), ror::<18, 46>(x), ror::<41, 23>(x))
}

#[target_feature(enable = "avx2")]
#[inline]
fn small_sigma0(x: V) -> V {
    xor3(ror::<1, 63>(x), ror::<8, 56>(x), _mm256_srli_epi64::<7>(x))
}

#[target_feature(enable = "avx2")]
#[inline]
fn small_sigma1(x: V) -> V {
    xor3(ror::<19, 45>(x), ror::<61, 3>(x), _mm256_srli_epi64::<6>(x))
}

#[target_feature(enable = "avx2")]
#[inline]
fn gather(word: impl Fn(usize) -> u64) -> V {
    let w = |j| word(j) as i64;
    _mm256_set_epi64x(w(3), w(2), w(1), w(0))
}

#[target_feature(enable = "avx2")]
#[inline]
fn load_block(stage: &[[u8; crate::STAGE_BYTES]; WIDTH], at: usize) -> [V; 16] {
    std::array::from_fn(|t| {
        gather(|j| {
            let word = &stage[j][at + 8 * t..at + 8 * t + 8];
            u64::from_be_bytes(word.try_into().unwrap_or([0; 8]))
        })
    })
}

#[target_feature(enable = "avx2")]
#[inline]
fn scatter(v: V) -> [u64; WIDTH] {
    [
        _mm256_extract_epi64::<0>(v) as u64,
        _mm256_extract_epi64::<1>(v) as u64,
        _mm256_extract_epi64::<2>(v) as u64,
        _mm256_extract_epi64::<3>(v) as u64,
    ]
}
