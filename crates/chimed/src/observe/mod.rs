//! Observability: per-thread counters and the periodic stats lines, and the Prometheus endpoint
//! that reads the same counters.

pub(crate) mod metrics;
pub(crate) mod stats;
