//! What systemd is told (`Type=notify`, sd_notify(3)): ready once every socket is bound and every
//! service started, reloading and ready again around a SIGHUP, stopping on SIGTERM, and the
//! watchdog's keep-alive, sent only while every serving thread is moving
//! ([`Heartbeats`](crate::service::Heartbeats)). Without
//! `NOTIFY_SOCKET` (not started by systemd) each of these does nothing.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::{debug, warn};

/// The socket systemd listens on (`NOTIFY_SOCKET`), connected once at start, while chimed can
/// still reach it: sd_notify(3), and the sd-notify crate, find it by its path at every call,
/// which a chimed that has since changed root (`--root`) no longer could. The crate still
/// writes the messages.
#[derive(Debug)]
pub(crate) struct Notifier(Option<UnixDatagram>);

impl Notifier {
    /// Connects to `NOTIFY_SOCKET` (a path, or an abstract name after `@`); without it, or if it
    /// cannot be reached, every message is dropped.
    pub(crate) fn connect() -> Self {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET") else {
            return Self(None);
        };
        match connect(&name) {
            Ok(socket) => Self(Some(socket)),
            Err(e) => {
                let shown = name.display();
                warn!("NOTIFY_SOCKET {shown}: {e}; systemd will not hear from chimed");
                Self(None)
            }
        }
    }

    /// Tells systemd that every service is up.
    pub(crate) fn ready(&self) {
        self.send(&[NotifyState::Ready]);
    }

    /// Tells systemd that a reload began: `RELOADING=1` with the monotonic time, as
    /// `Type=notify-reload` requires; [`Self::ready`] ends it.
    pub(crate) fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    /// Tells systemd that chimed is stopping.
    pub(crate) fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// Feeds the watchdog.
    pub(crate) fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    fn send(&self, states: &[NotifyState]) {
        let Some(socket) = &self.0 else {
            return;
        };
        let message: String = states.iter().map(|s| format!("{s}\n")).collect();
        // systemd notices what it did not hear; a failed send is worth a debug line.
        if let Err(e) = socket.send(message.as_bytes()) {
            debug!("sd_notify: {e}");
        }
    }
}

fn connect(name: &OsStr) -> std::io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt as _;
    let addr = match name.as_bytes().strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(name)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.connect_addr(&addr)?;
    Ok(socket)
}

/// How often to feed the watchdog, if systemd asked for one (`WatchdogSec=`): twice per period,
/// as sd_watchdog_enabled(3) advises. Read as that page says: `WATCHDOG_USEC`, for this process
/// unless `WATCHDOG_PID` names another (sd_notify's own `watchdog_enabled` wants the PID set).
pub(crate) fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse() != Ok(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
