//! NTP: the batch handler the socket and XDP workers run, around chime-ntp's responder, and the
//! state every worker shares.

pub(crate) mod worker;

use std::sync::Arc;
use std::time::Instant;

use chime_ntp::{ClientLog, ClientTable, RateLimit};
use chime_xdp::{DriverLimits, DriverMaps};
use tracing::info;

use crate::access::Rules;
use crate::clock::published::Published;
use crate::config::Settings;
use crate::nts::keys as nts_keys;

/// Writes `limit` where the program that answers in the driver reads it (`--xdp-in-driver`), so
/// that it limits as the workers' table does; `None` turns its limiting off.
pub(crate) fn limit_in_driver(maps: &DriverMaps, limit: Option<RateLimit>) -> std::io::Result<()> {
    let limits = limit.map_or(DriverLimits::OFF, |l| {
        DriverLimits::new(l.interval(), l.burst(), l.leak(), l.kod())
    });
    maps.set_limits(&limits)
}

/// The state the NTP workers share: the clock, the access rules and NTS's cookie keys (if any)
/// from their owners, and the service's own rate limiting and interleaved-mode log.
pub(crate) fn shared(
    settings: &Settings,
    clock: Arc<Published>,
    access: Arc<Rules>,
    cookies: Option<nts_keys::InForce>,
) -> Arc<worker::Shared> {
    Arc::new(worker::Shared {
        clock,
        access,
        cookies,
        workers: Arc::new(crate::observe::stats::Workers::new("ntp")),
        stats_interval: settings.observe.stats_interval.duration(),
        ratelimit: settings.ntp_rate_limit().map(|r| {
            let table = ClientTable::new(r.limit, r.clients, rand::random()).relenting();
            info!(
                "ntp: rate limiting on: ratelimit {}, {} client addresses tracked ({} KiB)",
                r.limit,
                table.capacity(),
                table.bytes() / 1024
            );
            Arc::new(table)
        }),
        epoch: Instant::now(),
        clients: (settings.observe.client_log.0 > 0).then(|| {
            let log = ClientLog::new(settings.observe.client_log.0, rand::random());
            info!(
                "ntp: client log on: {} clients tracked ({} KiB), for chime clients",
                log.capacity(),
                log.bytes() / 1024
            );
            log
        }),
        txlog: (settings.ntp.interleaved_log.0 > 0).then(|| {
            let log = chime_ntp::TxLog::new(settings.ntp.interleaved_log.0);
            info!(
                "ntp: interleaved mode on: transmit times of {} replies kept ({} KiB)",
                log.capacity(),
                log.capacity() * 16 / 1024
            );
            log
        }),
    })
}
