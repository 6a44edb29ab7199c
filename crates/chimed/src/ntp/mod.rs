//! NTP: the batch handler the socket and XDP workers run, around chime-ntp's responder, and the
//! state every worker shares.

pub(crate) mod worker;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption};
use chime_ntp::nts::CookieKeys;
use chime_ntp::{ClientTable, ServerState, StalePolicy};
use tracing::info;

use crate::config::Settings;

/// The state the NTP workers share, unsynchronised until the upstream poller's first reply:
/// access rules, rate limiting, the interleaved-mode log, and NTS's cookie keys if any.
pub(crate) fn shared(settings: &Settings, cookies: Option<&CookieKeys>) -> Arc<worker::Shared> {
    Arc::new(worker::Shared {
        state: ArcSwap::from_pointee(ServerState::unsynchronised()),
        policy: StalePolicy {
            stale_after: settings.upstream.stale_after.duration(),
            ..StalePolicy::default()
        },
        workers: Arc::new(crate::observe::stats::Workers::new("ntp")),
        stats_interval: settings.observe.stats_interval.duration(),
        zone: ArcSwapOption::empty(),
        acl: ArcSwap::from_pointee(settings.acl.clone()),
        ratelimit: settings.ntp_rate_limit().map(|r| {
            let table = ClientTable::new(r.limit, r.clients, rand::random()).relenting();
            info!(
                "ntp: rate limiting on: ratelimit {}, {} client addresses tracked ({} KiB)",
                r.limit,
                table.capacity(),
                table.bytes() / 1024
            );
            table
        }),
        epoch: Instant::now(),
        nts: cookies.map(|keys| Arc::new(ArcSwap::from_pointee(keys.clone()))),
        txlog: (settings.ntp.interleaved_log.0 > 0).then(|| {
            let log = chime_ntp::TxLog::new(settings.ntp.interleaved_log.0);
            info!(
                "ntp: interleaved mode on: transmit times of {} replies kept ({} KiB)",
                log.capacity(),
                log.capacity() * 16 / 1024
            );
            log
        }),
        v5: settings.ntp.v5.then(|| {
            let v5 = worker::V5::new(rand::random);
            let bits: Vec<u16> = v5.own.bits().collect();
            info!(
                "ntp: NTPv5 on (drafts {}), server ID bits {bits:?}",
                chime_ntp::v5::Draft::ALL.map(|d| d.label()).join(" and "),
            );
            v5
        }),
        smear: settings.ntp.leap_smear,
    })
}
