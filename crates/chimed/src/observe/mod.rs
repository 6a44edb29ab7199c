//! Observability: what each worker counts (`counters`), its bookkeeping, the stats lines and the
//! totals at exit (`stats`), and the Prometheus endpoint that reads the same counts (`metrics`).

pub(crate) mod counters;
pub(crate) mod metrics;
pub(crate) mod stats;
