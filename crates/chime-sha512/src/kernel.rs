//! The SHA-512 compression function over vectors of message lanes, written once for every SIMD
//! backend.
//!
//! Lane `j` of every vector belongs to one message: `a`..`h` hold the eight working variables, `w`
//! the sixteen-word window of the message schedule. The round is FIPS 180-4 §6.4.2 word for word.
//! A backend module invokes [`lanes_kernel!`] with its target feature after defining the vector
//! type `V`, its lane count `WIDTH` and the primitives the round needs: `add`, `splat`, `ch`, `maj`,
//! `big_sigma0`, `big_sigma1`, `small_sigma0`, `small_sigma1`, `gather` (a vector whose lane `j` is
//! `word(j)`), `scatter` (the lanes of a vector, lane 0 first) and `load_block` (the sixteen
//! big-endian words of the block at byte `at` of each lane's staging area, word `t` of lane `j` in
//! lane `j` of vector `t`). Every one of them is a safe
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
                    let mut w = load_block(stage, at);
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
        ///
        /// The rounds are written out eight at a time with the working variables' names rotated
        /// (the `a` of one round is the `h` argument of the next), so that no register is copied
        /// to shift them along, and the schedule is extended sixteen words at a time before the
        /// sixteen rounds that use them: its words depend only on earlier words, never on the
        /// state. Rolled, with eight copies per round and a computed window index, the same
        /// rounds took about a third longer.
        #[target_feature(enable = $feature)]
        #[inline]
        fn block(state: &mut [V; 8], w: &mut [V; 16]) {
            let mut s = *state;
            for (r, k) in $crate::consts::K.chunks_exact(16).enumerate() {
                if r > 0 {
                    // w[t] is W[i-16]; the others are W[i-15], W[i-7] and W[i-2] in the window.
                    // Called with constants, so that the window stays in registers.
                    let mut next = |t: usize| {
                        let s0 = small_sigma0(w[(t + 1) % 16]);
                        let s1 = small_sigma1(w[(t + 14) % 16]);
                        w[t] = add(add(w[t], s0), add(w[(t + 9) % 16], s1));
                    };
                    next(0);
                    next(1);
                    next(2);
                    next(3);
                    next(4);
                    next(5);
                    next(6);
                    next(7);
                    next(8);
                    next(9);
                    next(10);
                    next(11);
                    next(12);
                    next(13);
                    next(14);
                    next(15);
                }
                for half in 0..2 {
                    let kw: [V; 8] =
                        std::array::from_fn(|t| add(w[8 * half + t], splat(k[8 * half + t])));
                    eight_rounds(&mut s, &kw);
                }
            }
            for (s, v) in state.iter_mut().zip(s) {
                *s = add(*s, v);
            }
        }

        /// Eight rounds, `kw[t]` being round `t`'s constant plus schedule word. After eight the
        /// names are back where they started.
        #[target_feature(enable = $feature)]
        #[inline]
        fn eight_rounds(s: &mut [V; 8], kw: &[V; 8]) {
            let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *s;
            round(a, b, c, &mut d, e, f, g, &mut h, kw[0]);
            round(h, a, b, &mut c, d, e, f, &mut g, kw[1]);
            round(g, h, a, &mut b, c, d, e, &mut f, kw[2]);
            round(f, g, h, &mut a, b, c, d, &mut e, kw[3]);
            round(e, f, g, &mut h, a, b, c, &mut d, kw[4]);
            round(d, e, f, &mut g, h, a, b, &mut c, kw[5]);
            round(c, d, e, &mut f, g, h, a, &mut b, kw[6]);
            round(b, c, d, &mut e, f, g, h, &mut a, kw[7]);
            *s = [a, b, c, d, e, f, g, h];
        }

        /// One round of FIPS 180-4 §6.4.2 in place: `d` becomes the new `e` and `h` the new `a`;
        /// the other six only change names.
        #[target_feature(enable = $feature)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        fn round(a: V, b: V, c: V, d: &mut V, e: V, f: V, g: V, h: &mut V, kw: V) {
            let t1 = add(add(*h, big_sigma1(e)), add(ch(e, f, g), kw));
            let t2 = add(big_sigma0(a), maj(a, b, c));
            *d = add(*d, t1);
            *h = add(t1, t2);
        }
    };
}

pub(crate) use lanes_kernel;
