//! The SHA-512 compression function over vectors of message lanes, written once for every SIMD
//! backend.
//!
//! Lane `j` of every vector belongs to one message: `a`..`h` hold the eight working variables, `w`
//! the sixteen-word window of the message schedule. The round is FIPS 180-4 §6.4.2 word for word.
//! A backend module invokes [`lanes_kernel!`] with its target feature after defining the vector
//! type `V`, its lane count `WIDTH` and the primitives the round needs: `add`, `splat`, `ch`, `maj`,
//! `big_sigma0`, `big_sigma1`, `small_sigma0`, `small_sigma1`, `gather` (a vector whose lane `j` is
//! `word(j)`) and `scatter` (the lanes of a vector, lane 0 first). Every one of them is a safe
//! function compiled for the same target feature, so the kernel is safe code; only calling it is
//! not (see `Lanes::compress`).

/// Generates `compress` (and its `block`) for the backend module it is invoked in.
macro_rules! lanes_kernel {
    ($feature:literal) => {
        /// Compresses lane `i`'s first `blocks[i]` blocks of `stage[i]` into `states[i]`, `WIDTH`
        /// lanes at a time.
        ///
        /// The lanes of a group step through the blocks together, as many as the group's longest
        /// message has; a lane that has run out goes on over stale bytes of its own staging area,
        /// and its state was taken out when its last block was done.
        #[target_feature(enable = $feature)]
        pub(crate) fn compress(
            states: &mut [[u64; 8]; $crate::LANES],
            stage: &[[u8; $crate::STAGE_BYTES]; $crate::LANES],
            blocks: &[usize; $crate::LANES],
        ) {
            let groups = states
                .chunks_exact_mut(WIDTH)
                .zip(stage.chunks_exact(WIDTH))
                .zip(blocks.chunks_exact(WIDTH));
            for ((states, stage), lanes) in groups {
                // Fixed-size views, so that indexing by lane needs no bounds checks.
                let (Ok(states), Ok(stage), Ok(lanes)) = (
                    <&mut [[u64; 8]; WIDTH]>::try_from(states),
                    <&[[u8; $crate::STAGE_BYTES]; WIDTH]>::try_from(stage),
                    <&[usize; WIDTH]>::try_from(lanes),
                ) else {
                    continue;
                };
                let rounds = lanes.iter().copied().max().unwrap_or(0);
                let mut state: [V; 8] = std::array::from_fn(|i| gather(|j| states[j][i]));
                for b in 0..rounds {
                    let at = b * $crate::BLOCK;
                    let mut w: [V; 16] = std::array::from_fn(|t| {
                        gather(|j| {
                            let word = &stage[j][at + 8 * t..at + 8 * t + 8];
                            u64::from_be_bytes(word.try_into().unwrap_or([0; 8]))
                        })
                    });
                    block(&mut state, &mut w);
                    if lanes.contains(&(b + 1)) {
                        let words = state.map(|v| scatter(v));
                        for (j, out) in states.iter_mut().enumerate() {
                            if lanes[j] == b + 1 {
                                *out = std::array::from_fn(|i| words[i][j]);
                            }
                        }
                    }
                }
            }
        }

        /// One block: 80 rounds over `w`, then the Davies–Meyer feed-forward into `state`.
        #[target_feature(enable = $feature)]
        #[inline]
        fn block(state: &mut [V; 8], w: &mut [V; 16]) {
            let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
            for (r, k) in $crate::consts::K.chunks_exact(16).enumerate() {
                for t in 0..16 {
                    if r > 0 {
                        // w[t] is W[i-16]; the others are W[i-15], W[i-7] and W[i-2] in the window.
                        let s0 = small_sigma0(w[(t + 1) % 16]);
                        let s1 = small_sigma1(w[(t + 14) % 16]);
                        w[t] = add(add(w[t], s0), add(w[(t + 9) % 16], s1));
                    }
                    let kw = add(w[t], splat(k[t]));
                    let t1 = add(add(h, big_sigma1(e)), add(ch(e, f, g), kw));
                    let t2 = add(big_sigma0(a), maj(a, b, c));
                    h = g;
                    g = f;
                    f = e;
                    e = add(d, t1);
                    d = c;
                    c = b;
                    b = a;
                    a = add(t1, t2);
                }
            }
            for (s, v) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
                *s = add(*s, v);
            }
        }
    };
}

pub(crate) use lanes_kernel;
