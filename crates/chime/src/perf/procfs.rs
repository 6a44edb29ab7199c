//! What /proc says about a step: the server's CPU time (and its busiest thread's), our own, the
//! datagrams the kernel dropped on full receive queues, ours and the server's, and the time the
//! hypervisor took from each CPU (steal).
//!
//! Read before and after each step; the differences are the step's.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::stats::ServerCpu;

/// The state of the counters at one moment.
#[derive(Debug)]
pub(crate) struct Snapshot {
    at: Instant,
    own_ticks: Option<u64>,
    /// The server's user and system time, and each of its threads' utime + stime.
    server: Option<(Ticks, HashMap<u32, u64>)>,
    drops: Option<Drops>,
    /// Per CPU, from /proc/stat: (steal, all ticks).
    cpus: Option<Vec<(u64, u64)>>,
}

/// A process's CPU time from its stat line, in clock ticks: `user` is its own code, `system` the
/// kernel's work on its behalf (system calls, and the softirq work, such as loopback delivery,
/// that runs on their way out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ticks {
    user: u64,
    system: u64,
}

impl Ticks {
    fn total(self) -> u64 {
        self.user + self.system
    }
}

/// Receive-queue drops summed over sockets.
#[derive(Clone, Copy, Debug)]
struct Drops {
    client: u64,
    server: Option<u64>,
}

/// What to look at.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) server_pid: Option<u32>,
    pub(crate) target: SocketAddr,
    pub(crate) client_ports: Vec<u16>,
}

/// The differences between two snapshots.
#[derive(Debug)]
pub(crate) struct Delta {
    pub(crate) server_cpu: Option<ServerCpu>,
    pub(crate) client_cpu_percent: f64,
    pub(crate) client_rx_drops: Option<u64>,
    pub(crate) server_rx_drops: Option<u64>,
    pub(crate) steal_pct: Option<Vec<f64>>,
}

impl Watch {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let server = self.server_pid.and_then(|pid| {
            let total = process_ticks(&pid.to_string()).ok()?;
            Some((total, task_ticks(pid)))
        });
        Snapshot {
            at: Instant::now(),
            own_ticks: process_ticks("self").ok().map(Ticks::total),
            server,
            drops: self.drops().ok(),
            cpus: std::fs::read_to_string("/proc/stat")
                .ok()
                .map(|t| cpu_steal(&t)),
        }
    }

    /// The differences from `before` to `after`. `answered` turns CPU time into time per reply;
    /// `busy` (the step's sending time) into a share of a core. The snapshots also span the wait
    /// for the last replies, when neither side does much, so dividing by the time between them
    /// would understate the load.
    pub(crate) fn delta(
        &self,
        before: &Snapshot,
        after: &Snapshot,
        answered: u64,
        busy: Duration,
    ) -> Delta {
        let wall = busy
            .min(after.at.duration_since(before.at))
            .as_secs_f64()
            .max(1e-9);
        let per_tick = 1.0 / clock_ticks_per_second();
        let percent = |ticks: u64| ticks as f64 * per_tick / wall * 100.0;
        let server_cpu = match (&before.server, &after.server) {
            (Some((b, b_tasks)), Some((a, a_tasks))) => {
                let ticks = a.total().saturating_sub(b.total());
                let system = a.system.saturating_sub(b.system);
                let busiest = a_tasks
                    .iter()
                    .map(|(tid, t)| t.saturating_sub(b_tasks.get(tid).copied().unwrap_or(0)))
                    .max()
                    .unwrap_or(0);
                let per_reply =
                    |t: u64| (answered > 0).then(|| t as f64 * per_tick * 1e6 / answered as f64);
                Some(ServerCpu {
                    us_per_reply: per_reply(ticks),
                    kernel_us_per_reply: per_reply(system),
                    percent: percent(ticks),
                    busiest_thread_percent: percent(busiest),
                })
            }
            _ => None,
        };
        let client_cpu_percent = match (before.own_ticks, after.own_ticks) {
            (Some(b), Some(a)) => percent(a.saturating_sub(b)),
            _ => 0.0,
        };
        let (client_rx_drops, server_rx_drops) = match (before.drops, after.drops) {
            (Some(b), Some(a)) => (
                Some(a.client.saturating_sub(b.client)),
                a.server.zip(b.server).map(|(a, b)| a.saturating_sub(b)),
            ),
            _ => (None, None),
        };
        let steal_pct = match (&before.cpus, &after.cpus) {
            (Some(b), Some(a)) if a.len() == b.len() => Some(
                b.iter()
                    .zip(a)
                    .map(|(&(bs, bt), &(a_s, at))| {
                        let total = at.saturating_sub(bt);
                        if total == 0 {
                            0.0
                        } else {
                            a_s.saturating_sub(bs) as f64 / total as f64 * 100.0
                        }
                    })
                    .collect(),
            ),
            _ => None,
        };
        Delta {
            server_cpu,
            client_cpu_percent,
            client_rx_drops,
            server_rx_drops,
            steal_pct,
        }
    }

    fn drops(&self) -> io::Result<Drops> {
        let table = if self.target.is_ipv4() {
            "/proc/net/udp"
        } else {
            "/proc/net/udp6"
        };
        let text = std::fs::read_to_string(table)?;
        // Only a server on this host shows up in our table; a remote one on the same port would be
        // some other local socket.
        let server_port = self.target.ip().is_loopback().then_some(self.target.port());
        Ok(udp_drops(&text, &self.client_ports, server_port))
    }
}

/// Clock ticks per second, the unit of /proc/PID/stat's times.
fn clock_ticks_per_second() -> f64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        // USER_HZ, which the kernel fixes at 100 on every architecture Linux runs chime on.
        _ => 100.0,
    }
}

/// utime and stime of a process (all its threads, live and exited), in clock ticks.
fn process_ticks(pid: &str) -> io::Result<Ticks> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    stat_ticks(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat line"))
}

/// utime + stime of each thread of a process. Threads that exit between the listing and the
/// read are skipped.
fn task_ticks(pid: u32) -> HashMap<u32, u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let text = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        Some((tid, stat_ticks(&text)?.total()))
    })
    .collect()
}

/// utime and stime from a /proc stat line: fields 14 and 15, counted after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn stat_ticks(text: &str) -> Option<Ticks> {
    let after_comm = &text[text.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Ticks {
        user: utime,
        system: stime,
    })
}

/// Each CPU's steal ticks (the time the hypervisor ran something else while this virtual CPU
/// had work) and its ticks of every kind, from the `cpuN` lines of /proc/stat: user nice system
/// idle iowait irq softirq steal (guest time is already inside user).
fn cpu_steal(stat: &str) -> Vec<(u64, u64)> {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let ticks: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(8)
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            (ticks.get(7).copied().unwrap_or(0), ticks.iter().sum())
        })
        .collect()
}

/// Sums the `drops` column of /proc/net/udp{,6} over our sockets and over the server's (its
/// SO_REUSEPORT group: every socket on its port).
fn udp_drops(table: &str, client_ports: &[u16], server_port: Option<u16>) -> Drops {
    let mut drops = Drops {
        client: 0,
        server: server_port.map(|_| 0),
    };
    let mut server_seen = false;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(count)) = (fields.get(1), fields.last()) else {
            continue;
        };
        let Some(port) = local
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
        else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        if client_ports.contains(&port) {
            drops.client += count;
        } else if Some(port) == server_port {
            server_seen = true;
            drops.server = drops.server.map(|d| d + count);
        }
    }
    if !server_seen {
        drops.server = None;
    }
    drops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_after_an_awkward_command_name() {
        let line = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 \
                    5 6 7";
        let ticks = stat_ticks(line).unwrap();
        assert_eq!((ticks.user, ticks.system, ticks.total()), (250, 75, 325));
        assert_eq!(stat_ticks("garbage"), None);
        assert!(process_ticks("self").is_ok());
    }

    #[test]
    fn steal_per_cpu() {
        let stat = "cpu  10 0 10 80 0 0 0 4 0 0\n\
                    cpu0 5 0 5 38 0 0 0 2 0 0\n\
                    cpu1 5 0 5 42 0 0 0 2 0 0\n\
                    intr 12345\n\
                    cpufreq_line_that_is_not_a_cpu 1 2 3\n";
        assert_eq!(cpu_steal(stat), vec![(2, 50), (2, 54)]);
        assert!(!cpu_steal(&std::fs::read_to_string("/proc/stat").unwrap()).is_empty());
    }

    #[test]
    fn drops_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
                     uid  timeout inode ref pointer drops\n\
             1: 0100007F:0EEF 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 1 2 \
             0000000000000000 5\n\
             2: 0100007F:0EEF 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 2 2 \
             0000000000000000 7\n\
             3: 00000000:9C40 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 3 2 \
             0000000000000000 1\n";
        let d = udp_drops(table, &[0x9C40], Some(0x0EEF));
        assert_eq!((d.client, d.server), (1, Some(12)));
        let d = udp_drops(table, &[0x9C40], Some(1));
        assert_eq!(d.server, None);
    }
}
