//! Dropping root after the sockets are bound: optionally chroot, then switch to an unprivileged
//! user and its primary group. Privileged ports are bound first; nothing after this needs root.

use std::path::Path;

use anyhow::{Context, Result, bail};
use nix::unistd::{self, User};

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
