//! chimed, the chime daemon, as a library: it serves NTP (and NTS, and Roughtime, given keys) from
//! N worker threads per address family, each with its own `SO_REUSEPORT` socket (the data plane),
//! while a small tokio runtime polls the local chronyd, rotates keys and handles signals (the
//! control plane). The binary is [`daemon::main`]; the services are laid out one folder each:
//!
//! - `daemon`: lifecycle, signals, reload, privilege drop: it composes the services, and only it
//!   imports itself;
//! - `service`: the contract every service fulfils (its error, threads, heartbeat, fail points);
//! - `config`: the flags, the config file and the settings they resolve to;
//! - `clock`: the system clock, the upstream (chronyd) mirror, the timezone-offset mode;
//! - `access`: who is served;
//! - `ntp`, `nts`, `roughtime`: the protocols' services;
//! - `observe`: counters, stats lines, metrics.
//!
//! Key files are read and written through `chime-keyfile`.

#![forbid(unsafe_code)]

mod access;
mod clock;
mod config;
mod control;
pub mod daemon;
mod ntp;
mod nts;
mod observe;
mod reply;
mod roughtime;
mod service;
