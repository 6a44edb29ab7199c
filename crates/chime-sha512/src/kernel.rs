//! The SHA-512 compression function over vectors of message lanes, written once for every SIMD
//! backend.
//!
//! Lane `j` of every vector belongs to one message: `a`..`h` hold the eight working variables, `w`
//! the sixteen-word window of the message schedule. The round is FIPS 180-4 §6.4.2 word for word.
//! A backend module invokes [`lanes_kernel!`] after defining the vector type `V`, its lane count
//! `WIDTH`, and `Isa`: a newtype over the `pulp` token that proves the CPU has the backend's
//! instructions, with a method for each primitive the round needs: `add`, `splat`, `ch`, `maj`,
//! `big_sigma0`, `big_sigma1`, `small_sigma0`, `small_sigma1`, `gather` (a vector whose lane `j` is
//! `word(j)`), `scatter` (the lanes of a vector, lane 0 first) and `load_block` (the sixteen
//! big-endian words of the block at byte `at` of each lane's staging area, word `t` of lane `j` in
//! lane `j` of vector `t`).
//!
//! All of it is safe code: a token exists only once `pulp` has seen the CPU features at run time, its
//! intrinsics are safe methods, and `vectorize` runs the kernel in a function compiled for those
//! features. Everything below it is `#[inline(always)]`, so that it is compiled there too: an
//! intrinsic left in a function compiled without the feature would become a call per
//! instruction.

/// Generates `Isa::compress` and the methods under it for the backend module it is invoked in.
macro_rules! lanes_kernel {
    () => {
        /// One `compress` call's arguments: `vectorize` calls it in a function compiled for the
        /// token's features, and its `call` is inlined there, so the kernel below is too (a
        /// closure would not be: the kernel is far larger than the inliner takes unasked).
        struct Compress<'a> {
            isa: Isa,
            states: &'a mut [[u64; 8]; $crate::LANES],
            stage: &'a [[u8; $crate::STAGE_BYTES]; $crate::LANES],
            blocks: &'a [usize; $crate::LANES],
        }

        impl pulp::NullaryFnOnce for Compress<'_> {
            type Output = ();

            #[inline(always)]
            fn call(self) {
                self.isa
                    .compress_inline(self.states, self.stage, self.blocks)
            }
        }

        impl Isa {
            /// Compresses lane `i`'s first `blocks[i]` blocks of `stage[i]` into `states[i]`, `WIDTH`
            /// lanes at a time.
            ///
            /// The lanes of a group step through the blocks together, as many as the group's longest
            /// message has; a lane that has run out goes on over stale bytes of its own staging area,
            /// and its state was taken out when its last block was done.
            pub(crate) fn compress(
                self,
                states: &mut [[u64; 8]; $crate::LANES],
                stage: &[[u8; $crate::STAGE_BYTES]; $crate::LANES],
                blocks: &[usize; $crate::LANES],
            ) {
                self.0.vectorize(Compress {
                    isa: self,
                    states,
                    stage,
                    blocks,
                })
            }

            /// `compress`'s body, run by `Compress::call` inside `vectorize`.
            #[inline(always)]
            fn compress_inline(
                self,
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
                    let mut state = [self.splat(0); 8];
                    for (i, v) in state.iter_mut().enumerate() {
                        *v = self.gather(|j| states[j][i]);
                    }
                    for b in 0..rounds {
                        let at = b * $crate::BLOCK;
                        let mut w = self.load_block(stage, at);
                        self.block(&mut state, &mut w);
                        if lanes.contains(&(b + 1)) {
                            let words = state.map(|v| self.scatter(v));
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
            #[inline(always)]
            fn block(self, state: &mut [V; 8], w: &mut [V; 16]) {
                let mut s = *state;
                for (r, k) in $crate::consts::K.chunks_exact(16).enumerate() {
                    if r > 0 {
                        // Called with constants, so that the window stays in registers.
                        self.schedule(w, 0);
                        self.schedule(w, 1);
                        self.schedule(w, 2);
                        self.schedule(w, 3);
                        self.schedule(w, 4);
                        self.schedule(w, 5);
                        self.schedule(w, 6);
                        self.schedule(w, 7);
                        self.schedule(w, 8);
                        self.schedule(w, 9);
                        self.schedule(w, 10);
                        self.schedule(w, 11);
                        self.schedule(w, 12);
                        self.schedule(w, 13);
                        self.schedule(w, 14);
                        self.schedule(w, 15);
                    }
                    for half in 0..2 {
                        let mut kw = [self.splat(0); 8];
                        for (t, kw) in kw.iter_mut().enumerate() {
                            *kw = self.add(w[8 * half + t], self.splat(k[8 * half + t]));
                        }
                        self.eight_rounds(&mut s, &kw);
                    }
                }
                for (s, v) in state.iter_mut().zip(s) {
                    *s = self.add(*s, v);
                }
            }

            /// The schedule's next word in place of `w[t]`, which is W[i-16]; W[i-15], W[i-7] and
            /// W[i-2] are the window's words after it.
            #[inline(always)]
            fn schedule(self, w: &mut [V; 16], t: usize) {
                let s0 = self.small_sigma0(w[(t + 1) % 16]);
                let s1 = self.small_sigma1(w[(t + 14) % 16]);
                w[t] = self.add(self.add(w[t], s0), self.add(w[(t + 9) % 16], s1));
            }

            /// Eight rounds, `kw[t]` being round `t`'s constant plus schedule word. After eight the
            /// names are back where they started.
            #[inline(always)]
            fn eight_rounds(self, s: &mut [V; 8], kw: &[V; 8]) {
                let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *s;
                self.round(a, b, c, &mut d, e, f, g, &mut h, kw[0]);
                self.round(h, a, b, &mut c, d, e, f, &mut g, kw[1]);
                self.round(g, h, a, &mut b, c, d, e, &mut f, kw[2]);
                self.round(f, g, h, &mut a, b, c, d, &mut e, kw[3]);
                self.round(e, f, g, &mut h, a, b, c, &mut d, kw[4]);
                self.round(d, e, f, &mut g, h, a, b, &mut c, kw[5]);
                self.round(c, d, e, &mut f, g, h, a, &mut b, kw[6]);
                self.round(b, c, d, &mut e, f, g, h, &mut a, kw[7]);
                *s = [a, b, c, d, e, f, g, h];
            }

            /// One round of FIPS 180-4 §6.4.2 in place: `d` becomes the new `e` and `h` the new `a`;
            /// the other six only change names.
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn round(self, a: V, b: V, c: V, d: &mut V, e: V, f: V, g: V, h: &mut V, kw: V) {
                let t1 = self.add(
                    self.add(*h, self.big_sigma1(e)),
                    self.add(self.ch(e, f, g), kw),
                );
                let t2 = self.add(self.big_sigma0(a), self.maj(a, b, c));
                *d = self.add(*d, t1);
                *h = self.add(t1, t2);
            }
        }
    };
}

pub(crate) use lanes_kernel;
