//! chime's XDP programs loaded on no interface and run on frames with `BPF_PROG_TEST_RUN`: the
//! kernel verifies and runs the very instructions it would run in a driver, without a network.
//! How the tests see what each program does to a frame. Loading needs root (`CAP_BPF` and
//! `CAP_NET_ADMIN`).

use std::{
    io,
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd},
    time::Duration,
};

use crate::{
    asm::{XDP_DROP, XDP_PASS, XDP_TX},
    bpf,
    responder::{self, DriverMaps, DriverOutcome, DriverRule, DriverState},
};

/// One of the programs, loaded with its maps: an XSKMAP of one queue, which holds no socket, and
/// for the answering program its [`DriverMaps`], with no state (nothing answered) until
/// [`Self::set_state`].
#[derive(Debug)]
pub struct XdpProgram {
    prog: OwnedFd,
    _xsks: OwnedFd,
    maps: Option<DriverMaps>,
    len: usize,
}

/// Where a frame went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `XDP_PASS` with no metadata: to the kernel's stack.
    Kernel,
    /// To the AF_XDP socket of its queue: its receive time and the magic in its metadata, then
    /// the redirect. The XSKMAP here holds no socket, so the redirect returns its fallback,
    /// `XDP_PASS`, as on a queue without an XDP thread.
    Socket,
    /// `XDP_TX`: sent back out of the interface it came in on.
    Tx,
    /// `XDP_DROP` with no metadata: dropped.
    Drop,
    /// Anything else: the verdict, and the length of the metadata left.
    Other(u32, usize),
}

/// One run: where the frame went, and the frame as the program left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Where the frame went.
    pub outcome: Outcome,
    /// The frame as the program left it (without its metadata).
    pub frame: Vec<u8>,
}

impl XdpProgram {
    /// The steering program, as [`crate::XdpBound`] attaches it, for `targets`; an unspecified
    /// address stands for every address of its family.
    pub fn steering(targets: &[SocketAddr]) -> io::Result<Self> {
        let xsks = bpf::create_xskmap(1)?;
        let insns = bpf::program(xsks.as_raw_fd(), &bpf::targets(targets));
        Ok(Self {
            prog: bpf::load_xdp(&insns)?,
            _xsks: xsks,
            maps: None,
            len: insns.len(),
        })
    }

    /// The answering program for `targets`, answering NTP requests to those of `ntp` (which
    /// must be among them) in the driver; its rate limiter's table of 4 addresses, the limits
    /// off.
    pub fn answering(targets: &[SocketAddr], ntp: &[SocketAddr]) -> io::Result<Self> {
        Self::answering_limited(targets, ntp, 4, [0x5eed, 0x5eed])
    }

    /// [`Self::answering`] with a rate limiter's table for `clients` addresses, its hash keyed
    /// by `seed` (as chime-ntp's `ClientTable::new(limit, clients, seed)`), the limits off until
    /// [`DriverMaps::set_limits`].
    pub fn answering_limited(
        targets: &[SocketAddr],
        ntp: &[SocketAddr],
        clients: usize,
        seed: [u64; 2],
    ) -> io::Result<Self> {
        let xsks = bpf::create_xskmap(1)?;
        let maps = DriverMaps::with_seed(clients, seed)?;
        let insns = responder::program(
            xsks.as_raw_fd(),
            maps.fds(),
            maps.access_fd(),
            maps.limiter(),
            &bpf::targets(targets),
            &bpf::targets(ntp),
        );
        Ok(Self {
            prog: bpf::load_xdp(&insns)?,
            _xsks: xsks,
            maps: Some(maps),
            len: insns.len(),
        })
    }

    /// The program's length in instructions.
    pub fn instructions(&self) -> usize {
        self.len
    }

    /// Makes `state` the answering program's ([`DriverMaps::set_state`]).
    ///
    /// # Panics
    /// On the steering program, which has none.
    pub fn set_state(&self, state: &DriverState) -> io::Result<()> {
        self.driver_maps().set_state(state)
    }

    /// Makes `rules` the answering program's ([`DriverMaps::set_access`]).
    ///
    /// # Panics
    /// On the steering program, which has none.
    pub fn set_access(&self, rules: &[DriverRule]) -> io::Result<()> {
        self.driver_maps().set_access(rules)
    }

    /// The answering program's counts so far ([`DriverMaps::counts`]).
    ///
    /// # Panics
    /// On the steering program, which has none.
    pub fn counts(&self) -> io::Result<Vec<(DriverOutcome, u64)>> {
        self.driver_maps().counts()
    }

    /// The answering program's maps, which a test may write from another thread.
    ///
    /// # Panics
    /// On the steering program, which has none.
    pub fn driver_maps(&self) -> &DriverMaps {
        self.maps.as_ref().expect("the answering program")
    }

    /// Runs the program on `frame` `runs` times, each on the frame as given, and returns the
    /// kernel's measure of the time the program took, summed over the runs: its own cost, for
    /// benches.
    pub fn time(&self, frame: &[u8], runs: u64) -> io::Result<Duration> {
        let mut ns = 0u64;
        for _ in 0..runs {
            ns += u64::from(bpf::test_run(&self.prog, frame)?.ns);
        }
        Ok(Duration::from_nanos(ns))
    }

    /// Runs the program once on `frame`. The kernel refuses (`EINVAL`) a frame shorter than an
    /// Ethernet header.
    pub fn run(&self, frame: &[u8]) -> io::Result<Run> {
        let run = bpf::test_run(&self.prog, frame)?;
        let magic = bpf::META_MAGIC.to_ne_bytes();
        let outcome = match (run.verdict, run.meta.len()) {
            (v, 0) if v == XDP_PASS as u32 => Outcome::Kernel,
            (v, bpf::META_LEN) if v == XDP_PASS as u32 && run.meta[8..] == magic => Outcome::Socket,
            (v, 0) if v == XDP_TX as u32 => Outcome::Tx,
            (v, 0) if v == XDP_DROP as u32 => Outcome::Drop,
            (v, meta) => Outcome::Other(v, meta),
        };
        Ok(Run {
            outcome,
            frame: run.frame,
        })
    }
}
