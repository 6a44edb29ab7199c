//! Eight lanes in AVX-512 registers. The 64-bit rotate (`vprorq`) and three-input logic
//! (`vpternlogq`: 0x96 is a three-way XOR, 0xCA is Ch, 0xE8 is Maj) keep a round near the scalar
//! instruction count, eight times over.
//!
//! A block's words arrive transposed: each lane's 128 bytes are read as two vectors of eight
//! words, byte-swapped in one shuffle (AVX-512BW's `vpshufb`), and an 8×8 transpose of 64-bit
//! elements (24 shuffles per half) turns them into the sixteen vectors that hold word `t` of every
//! lane. Assembling each of those vectors from eight scalar loads and byte swaps took about 430
//! instructions a block, against about 80.

use std::arch::x86_64::{
    __m512i, _mm256_extract_epi64, _mm512_add_epi64, _mm512_extracti64x4_epi64,
    _mm512_permutex2var_epi64, _mm512_ror_epi64, _mm512_set_epi64, _mm512_set1_epi64,
    _mm512_shuffle_epi8, _mm512_srli_epi64, _mm512_ternarylogic_epi64, _mm512_unpackhi_epi64,
    _mm512_unpacklo_epi64,
};

type V = __m512i;
const WIDTH: usize = 8;

crate::kernel::lanes_kernel!("avx512f,avx512bw");

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn add(a: V, b: V) -> V {
    _mm512_add_epi64(a, b)
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn splat(k: u64) -> V {
    _mm512_set1_epi64(k as i64)
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn ch(e: V, f: V, g: V) -> V {
    _mm512_ternarylogic_epi64::<0xCA>(e, f, g)
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn maj(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi64::<0xE8>(a, b, c)
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn xor3(a: V, b: V, c: V) -> V {
    _mm512_ternarylogic_epi64::<0x96>(a, b, c)
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn big_sigma0(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<28>(x),
        _mm512_ror_epi64::<34>(x),
        _mm512_ror_epi64::<39>(x),
    )
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn big_sigma1(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<14>(x),
        _mm512_ror_epi64::<18>(x),
        _mm512_ror_epi64::<41>(x),
    )
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn small_sigma0(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<1>(x),
        _mm512_ror_epi64::<8>(x),
        _mm512_srli_epi64::<7>(x),
    )
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn small_sigma1(x: V) -> V {
    xor3(
        _mm512_ror_epi64::<19>(x),
        _mm512_ror_epi64::<61>(x),
        _mm512_srli_epi64::<6>(x),
    )
}

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn gather(word: impl Fn(usize) -> u64) -> V {
    let w = |j| word(j) as i64;
    _mm512_set_epi64(w(7), w(6), w(5), w(4), w(3), w(2), w(1), w(0))
}

#[target_feature(enable = "avx512f,avx512bw")]
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

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn load_block(stage: &[[u8; crate::STAGE_BYTES]; WIDTH], at: usize) -> [V; 16] {
    // Within each 64-bit element, byte 7 first: big-endian words from little-endian lanes.
    let swap = _mm512_set_epi64(
        0x08090a0b0c0d0e0f,
        0x0001020304050607,
        0x08090a0b0c0d0e0f,
        0x0001020304050607,
        0x08090a0b0c0d0e0f,
        0x0001020304050607,
        0x08090a0b0c0d0e0f,
        0x0001020304050607,
    );
    // Words 8h..8h+8 of lane j's block. Eight adjacent little-endian reads into one vector, which
    // the compiler makes a single 64-byte load.
    let row = |j: usize, h: usize| {
        let start = at + 64 * h;
        let bytes = stage[j].get(start..start + 64).unwrap_or(&[0; 64]);
        let w = |i: usize| i64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
        _mm512_shuffle_epi8(
            _mm512_set_epi64(w(7), w(6), w(5), w(4), w(3), w(2), w(1), w(0)),
            swap,
        )
    };
    let low = transpose(std::array::from_fn(|j| row(j, 0)));
    let high = transpose(std::array::from_fn(|j| row(j, 1)));
    std::array::from_fn(|t| if t < 8 { low[t] } else { high[t - 8] })
}

/// Element `t` of `rows[j]` becomes element `j` of vector `t`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn transpose(rows: [V; 8]) -> [V; 8] {
    // `_mm512_set_epi64` lists elements from the highest; as index lists, element 0 first:
    // [0,1,8,9,4,5,12,13], [2,3,10,11,6,7,14,15], [0,1,2,3,8,9,10,11], [4,5,6,7,12,13,14,15].
    let even = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    let odd = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    let first = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
    let second = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
    let perm = |a, idx, b| _mm512_permutex2var_epi64(a, idx, b);
    // Pairs of rows: t[2p] has words 0, 2, 4, 6 of rows 2p and 2p+1 interleaved, t[2p+1] the
    // odd words.
    let t: [V; 8] = std::array::from_fn(|i| {
        let (a, b) = (rows[i / 2 * 2], rows[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Quads of rows: words 0 and 4, 2 and 6, 1 and 5, 3 and 7 of rows 0-3, then of rows 4-7.
    let u = [
        perm(t[0], even, t[2]),
        perm(t[0], odd, t[2]),
        perm(t[1], even, t[3]),
        perm(t[1], odd, t[3]),
        perm(t[4], even, t[6]),
        perm(t[4], odd, t[6]),
        perm(t[5], even, t[7]),
        perm(t[5], odd, t[7]),
    ];
    [
        perm(u[0], first, u[4]),
        perm(u[2], first, u[6]),
        perm(u[1], first, u[5]),
        perm(u[3], first, u[7]),
        perm(u[0], second, u[4]),
        perm(u[2], second, u[6]),
        perm(u[1], second, u[5]),
        perm(u[3], second, u[7]),
    ]
}
