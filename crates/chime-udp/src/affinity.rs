//! Pinning worker threads to CPUs.
//!
//! A worker pinned to a CPU keeps its socket's data hot in that CPU's caches, and, with the NIC's
//! receive queues steered to the same CPUs, a datagram is handled where it arrived.
//! [`crate::Threads::spawn`] pins each worker thread as its first act, when
//! [`crate::WorkerConfig::cpus`] asks for it.

use std::{io, mem::size_of};

use crate::{
    error::ConfigError,
    sys::{Zeroable, cvt},
};

/// The number of CPUs a `cpu_set_t` can name; CPU numbers must be below it.
pub(crate) const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// The CPUs this process may run on (its affinity mask, as `taskset` or a cpuset cgroup left it),
/// in ascending order: the candidates for [`crate::WorkerConfig::cpus`].
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let mut set = libc::cpu_set_t::zeroed();
    // SAFETY: `set` is a live, writable cpu_set_t and the size passed is its size, so the kernel
    // writes within it. Pid 0 means the calling thread.
    cvt(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..MAX_CPUS)
        // SAFETY: `cpu < MAX_CPUS`, the number of CPUs a cpu_set_t holds, so CPU_ISSET reads
        // within `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Restricts the calling thread to run only on `cpu`.
pub(crate) fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= MAX_CPUS {
        return Err(ConfigError::CpuOutOfRange {
            cpu,
            max: MAX_CPUS - 1,
        }
        .into());
    }
    let mut set = libc::cpu_set_t::zeroed();
    // SAFETY: `cpu < MAX_CPUS` (checked above), so CPU_SET writes within `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live cpu_set_t and the size passed is its size, so the kernel reads
    // within it. Pid 0 means the calling thread, not the whole process.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_an_allowed_cpu() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let cpu = *allowed.last().unwrap();
        // Pin a scratch thread, not the test harness's.
        let seen = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            allowed_cpus().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![cpu]);
    }

    #[test]
    fn refuses_out_of_range_cpu() {
        let err = pin_current_thread(MAX_CPUS).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
