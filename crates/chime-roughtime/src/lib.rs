//! Sans-IO Roughtime (in progress).
#![forbid(unsafe_code)]
