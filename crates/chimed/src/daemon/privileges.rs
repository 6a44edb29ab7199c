//! Dropping root after the sockets are bound: optionally chroot, then switch to an unprivileged
//! user and its primary group. Privileged ports are bound first; nothing after this needs root.

use std::path::Path;

use anyhow::{Context, Result, bail};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::unistd::{self, User};
use tracing::{debug, warn};

/// Raises the soft limit on open files to the hard one, as the TCP services may hold `needed`
/// connections at once (NTS-KE's session slots, Roughtime's connections) and a soft limit of 1024
/// (systemd's and most shells' default) would turn clients away with EMFILE long before that.
/// Warns if even the hard limit is below `needed`.
pub(crate) fn raise_open_files(needed: u64) {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let soft = match soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        true => hard,
        false => soft,
    };
    debug!("open files: at most {soft}");
    if soft < needed {
        warn!(
            "open files: at most {soft}, below the {needed} the TCP services may hold at once; \
             raise the hard limit (systemd: LimitNOFILE=)"
        );
    }
}

pub(crate) fn drop_to(user: Option<&str>, root: Option<&Path>) -> Result<()> {
    // Look the user up before the chroot: /etc/passwd is usually not inside it.
    let user = match user {
        Some(name) => Some(
            User::from_name(name)
                .with_context(|| format!("--user {name}: cannot look up the user"))?
                .with_context(|| format!("--user {name}: no such user"))?,
        ),
        None => None,
    };
    if let Some(dir) = root {
        unistd::chroot(dir).with_context(|| format!("--root {}: chroot failed", dir.display()))?;
        unistd::chdir("/").with_context(|| format!("--root {}: chdir failed", dir.display()))?;
    }
    if let Some(user) = user {
        if unistd::geteuid() == user.uid {
            // Already that user (a systemd unit's User=): nothing to drop.
            return Ok(());
        }
        unistd::setgroups(&[user.gid]).context("setgroups failed")?;
        unistd::setgid(user.gid).with_context(|| format!("setgid({}) failed", user.gid))?;
        unistd::setuid(user.uid).with_context(|| format!("setuid({}) failed", user.uid))?;
        if user.uid.as_raw() != 0 && unistd::setuid(unistd::Uid::from_raw(0)).is_ok() {
            bail!(
                "--user {}: root privileges could be regained after dropping them",
                user.name
            );
        }
    }
    Ok(())
}
