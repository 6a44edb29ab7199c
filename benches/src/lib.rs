//! Criterion benches live in `benches/`; this crate has no library code of its own.
