//! The metrics endpoint (`--metrics-address`): chimed's own build and start time, and what each
//! service registered as it started ([`Registry`]): the workers' counters, labelled by service,
//! NTS-KE's sessions, Roughtime over TCP's connections, AF_XDP's drops, the mirrored upstream and
//! what clients are told about it, and the Roughtime online key's validity. In Prometheus' text
//! format, over hyper's HTTP/1.1 server on the control plane.
//!
//! It answers `GET` and `HEAD` of `/metrics` and nothing else, one request per connection. A
//! request head larger than 8 KiB, or not complete within 5 s, is refused or dropped; at most 16
//! connections are served at once and further ones are closed at once. It never touches the data
//! plane: workers publish their counts (see `stats::Published`) and the endpoint only reads them.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chime_ntp::nts::NakReason;
use chime_roughtime::Version;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use tokio::net::TcpListener;

use crate::observe::counters::{Note, PublishedCounts};
use crate::observe::stats::{Listed, Published};
use crate::service::ServiceError;

/// What the endpoint serves, filled in as the services start: each registers its own collector,
/// and the data plane's services their workers, whose counters share metric families (one family
/// per name, its series labelled by service).
pub(crate) struct Registry {
    collectors: prometheus_client::registry::Registry,
    workers: Vec<Arc<dyn Listed>>,
}

impl Registry {
    /// chimed's own metrics, its start at `started_unix`, and no service yet.
    pub(crate) fn new(started_unix: i64) -> Self {
        let mut collectors = prometheus_client::registry::Registry::default();
        collectors.register_collector(Box::new(Process { started_unix }));
        Self {
            collectors,
            workers: Vec::new(),
        }
    }

    /// A service's own collector, every series of it labelled `service` with the service's name
    /// (as its log lines' span names it).
    pub(crate) fn collector(&mut self, service: &'static str, collector: impl Collector) {
        let label = (Cow::Borrowed("service"), Cow::Borrowed(service));
        let registry = self.collectors.sub_registry_with_label(label);
        registry.register_collector(Box::new(collector));
    }

    /// A service's own metrics, labelled as [`Registry::collector`]'s: `encode` writes them from
    /// `state` at each scrape.
    pub(crate) fn encoded<T: fmt::Debug + Send + Sync + 'static>(
        &mut self,
        service: &'static str,
        state: Arc<T>,
        encode: fn(&mut DescriptorEncoder, &T) -> fmt::Result,
    ) {
        self.collector(service, Encoded(state, encode));
    }

    /// A data-plane service's workers, whose counters are served labelled by its name.
    pub(crate) fn workers(&mut self, workers: Arc<dyn Listed>) {
        self.workers.push(workers);
    }

    /// Everything registered, for the endpoint.
    fn finish(mut self) -> prometheus_client::registry::Registry {
        let families = WorkerFamilies(self.workers);
        self.collectors.register_collector(Box::new(families));
        self.collectors
    }
}

/// A collector made of a service's shared state and the function that encodes it.
struct Encoded<T>(Arc<T>, fn(&mut DescriptorEncoder, &T) -> fmt::Result);

impl<T: fmt::Debug> fmt::Debug for Encoded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Encoded").field(&self.0).finish()
    }
}

impl<T: fmt::Debug + Send + Sync + 'static> Collector for Encoded<T> {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        (self.1)(&mut enc, &self.0)
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Registry")
    }
}

/// What the metrics say about `--xdp`.
#[derive(Debug)]
pub(crate) struct Xdp {
    pub(crate) interface: String,
    pub(crate) mode: &'static str,
    pub(crate) stats: Arc<chime_xdp::XdpStats>,
    /// `--xdp-in-driver`: the answering program's maps, whose counts are read at each scrape.
    pub(crate) driver: Option<Arc<chime_xdp::DriverMaps>>,
}

/// The longest request head hyper buffers (its minimum); a longer one gets 431.
const MAX_HEAD: usize = 8192;
/// How long a client may take to send its request head, and then the whole exchange.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_CONNECTIONS: usize = 16;

/// Serves the endpoint on `listener` (bound before privileges were dropped) until aborted. HTTP
/// is hyper's: one request per connection (no keep-alive), the head within [`READ_TIMEOUT`] and
/// [`MAX_HEAD`] bytes, at most [`MAX_CONNECTIONS`] at once (more are closed at once).
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    registry: Registry,
) -> Result<(), ServiceError> {
    fail::fail_point!("metrics", |_| Err(crate::service::fail_point_error(
        "metrics"
    )));
    let listener = listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .map_err(|e| ServiceError::Failed(format!("cannot listen: {e}")))?;
    let registry = Arc::new(registry.finish());
    crate::service::serve_connections("metrics", MAX_CONNECTIONS, listener, |stream| {
        let registry = registry.clone();
        async move {
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&request, &registry);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // A client that goes away mid-answer, or reads it too slowly, is its own
            // business.
            let _ = tokio::time::timeout(2 * READ_TIMEOUT, connection).await;
        }
    })
    .await
}

type Body = http_body_util::Full<bytes::Bytes>;

/// The answer to a request hyper has parsed: the page for `GET` and `HEAD` of `/metrics` (hyper
/// leaves out a `HEAD` answer's body), 404 elsewhere, 405 for other methods.
fn respond<B>(
    request: &hyper::Request<B>,
    registry: &prometheus_client::registry::Registry,
) -> hyper::Response<Body> {
    if request.uri().path() != "/metrics" {
        return plain(
            hyper::StatusCode::NOT_FOUND,
            "the metrics are at /metrics\n",
        );
    }
    match *request.method() {
        hyper::Method::GET | hyper::Method::HEAD => {
            let mut r = hyper::Response::new(Body::from(render(registry)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        _ => plain(hyper::StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n"),
    }
}

fn plain(status: hyper::StatusCode, body: &'static str) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Picks one count out of a worker's counts.
type CountOf = fn(&PublishedCounts) -> u64;

/// A sample's labels.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// The labels of a worker's series.
fn worker_labels(w: &Published) -> Labels {
    vec![
        ("service", w.service.to_string()),
        ("family", w.family.to_string()),
        ("thread", w.thread.to_string()),
    ]
}

/// A metric family with one sample and no labels. A counter's name ends in `_total`, which the
/// encoder adds itself.
pub(crate) fn single<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: M,
) -> fmt::Result {
    metric.encode(enc.encode_descriptor(base(name, &metric), help, None, metric.metric_type())?)
}

/// A counter family with a sample for each label set (none at all is a family without series).
/// Its name ends in `_total`, which the encoder adds itself.
pub(crate) fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let base = name.strip_suffix("_total").unwrap_or(name);
    let mut family = enc.encode_descriptor(base, help, None, MetricType::Counter)?;
    for (labels, n) in samples {
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The name a family is described by: a counter's without its `_total`.
fn base<'n, M: EncodeMetric>(name: &'n str, metric: &M) -> &'n str {
    match metric.metric_type() {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    }
}

/// The metric of each NTP [`Note`], in order, with its help text. Roughtime's notes are one family,
/// `chimed_roughtime_replies_total`, labelled by version.
const NOTE_METRICS: [(Note, &str, &str); 8] = [
    (
        Note::Kod,
        "chimed_kod_sent_total",
        "Replies made a Kiss-o'-Death RATE by NTP rate limiting (--ratelimit-kod).",
    ),
    (
        Note::Interleaved,
        "chimed_interleaved_replies_total",
        "NTP replies in interleaved mode (RFC 9769), carrying the previous reply's transmit time.",
    ),
    (
        Note::KernelTxTimestamp,
        "chimed_kernel_tx_timestamps_total",
        "Kernel transmit timestamps read back for interleaved mode.",
    ),
    (
        Note::Nts,
        "chimed_nts_replies_total",
        "NTP replies authenticated with NTS.",
    ),
    (
        Note::NtsNak,
        "chimed_nts_naks_total",
        "NTS NAKs sent: a cookie that did not open or serves the other protocol, or an \
         authenticator that did not verify (by why in chimed_nts_nak_reasons_total).",
    ),
    (
        Note::V5,
        "chimed_ntpv5_replies_total",
        "NTPv5 replies (--ntpv5, as drafted).",
    ),
    (
        Note::Upgrade,
        "chimed_ntpv5_upgrades_total",
        "NTPv4 replies echoing a client's NTPv5 upgrade mark (NTP5DRFT).",
    ),
    (
        Note::Tai,
        "chimed_ntpv5_tai_replies_total",
        "NTPv5 replies in TAI, as their requests asked (requests for TAI are answered in UTC \
         while TAI - UTC is not known).",
    ),
];

/// Every metric, in the OpenMetrics text format, through prometheus-client's encoder.
fn render(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    // Writing to a String cannot fail, and no collector returns an error of its own.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// chimed's own: its version and when it started.
#[derive(Debug)]
struct Process {
    started_unix: i64,
}

impl Collector for Process {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        single(
            &mut enc,
            "chimed_build",
            "chimed's version.",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        )?;
        single(
            &mut enc,
            "chimed_start_time_seconds",
            "When chimed started, Unix seconds.",
            ConstGauge::new(self.started_unix),
        )
    }
}

/// The data plane's workers, every service's in one family per counter: read afresh at each
/// scrape from what the workers publish.
#[derive(Debug)]
struct WorkerFamilies(Vec<Arc<dyn Listed>>);

impl Collector for WorkerFamilies {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        workers(&mut enc, &self.0)
    }
}

/// Every worker thread's counters, labelled by service, family and thread.
fn workers(enc: &mut DescriptorEncoder, services: &[Arc<dyn Listed>]) -> fmt::Result {
    let workers: Vec<_> = services.iter().flat_map(|s| s.published()).collect();
    let counts: Vec<_> = workers.iter().map(|w| (w, w.load())).collect();
    let per_worker: [(&str, &str, CountOf); 6] = [
        (
            "chimed_requests_received_total",
            "Datagrams received.",
            |c| c.received,
        ),
        (
            "chimed_receive_batches_total",
            "Receive system calls that returned datagrams; received / batches is the mean batch \
             (for Roughtime, the requests one signature covered).",
            |c| c.batches,
        ),
        (
            "chimed_replies_sent_total",
            "Replies the kernel accepted.",
            |c| c.answered,
        ),
        (
            "chimed_send_errors_total",
            "Replies the kernel refused.",
            |c| c.send_errors,
        ),
        (
            "chimed_kernel_receive_drops_total",
            "Requests the kernel dropped at the socket before chimed could receive them (its \
             receive buffer was full): load the other counters never saw. Read every 64 batches.",
            |c| c.kernel_drops,
        ),
        (
            "chimed_requests_shed_total",
            "Requests received and not answered under a standing overload: they had waited in \
             the receive queue longer than --shed-target, while the oldest waiting had stayed \
             above it for --shed-interval. Also in chimed_requests_received_total.",
            |c| c.shed,
        ),
    ];
    for (name, help, value) in per_worker {
        counters(
            enc,
            name,
            help,
            counts.iter().map(|(w, c)| (worker_labels(w), value(c))),
        )?;
    }
    let of = |service: &'static str| counts.iter().filter(move |(w, _)| w.service == service);
    for (note, name, help) in NOTE_METRICS {
        counters(
            enc,
            name,
            help,
            of("ntp").map(|(w, c)| (worker_labels(w), c.notes[note.index()])),
        )?;
    }
    let nak_reasons = NakReason::ALL.map(|why| (why.label(), Note::NtsNakWhy(why)));
    let versions: Vec<_> = reply_versions().collect();
    counters(
        enc,
        "chimed_nts_nak_reasons_total",
        "NTS NAKs sent, by why: the cookie names a key not held here (unknown_key), does not open \
         (bad_cookie) or serves the other protocol (other_protocol), or the authenticator does not \
         verify (forged).",
        by_note(of("ntp"), "reason", &nak_reasons),
    )?;
    counters(
        enc,
        "chimed_roughtime_replies_total",
        "Roughtime replies by the version they speak: its VER number (1 is RFC 10049), or google.",
        by_note(of("roughtime"), "version", &versions),
    )?;
    counters(
        enc,
        "chimed_roughtime_greased_total",
        "Roughtime replies made deliberately invalid by --roughtime-grease (also counted by \
         version in chimed_roughtime_replies_total).",
        of("roughtime").map(|(w, c)| (worker_labels(w), c.notes[Note::Greased.index()])),
    )?;
    counters(
        enc,
        "chimed_requests_dropped_total",
        "Datagrams dropped without a reply, by reason.",
        counts.iter().flat_map(|(w, c)| {
            w.labels.iter().zip(&c.dropped).map(|(reason, n)| {
                let mut labels = worker_labels(w);
                labels.push(("reason", (*reason).to_string()));
                (labels, *n)
            })
        }),
    )?;

    Ok(())
}

/// AF_XDP: the interface and mode, and the workers' own counts.
impl Collector for Xdp {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        xdp(&mut enc, self)
    }
}

fn xdp(enc: &mut DescriptorEncoder, x: &Xdp) -> fmt::Result {
    single(
        enc,
        "chimed_xdp",
        "AF_XDP on (--xdp): the interface and the mode the driver granted (zero-copy or copy).",
        Info::new(vec![
            ("interface", x.interface.clone()),
            ("mode", x.mode.to_string()),
        ]),
    )?;
    let s = &x.stats;
    counters(
        enc,
        "chimed_xdp_frames_dropped_total",
        "Frames the XDP program redirected that the XDP workers dropped: malformed (a bad \
         checksum, lengths that do not add up, not to a served address), tx_ring_full (the \
         reply found no room to be sent).",
        [
            ("malformed", &s.malformed),
            ("tx_ring_full", &s.tx_ring_full),
        ]
        .map(|(reason, n)| (vec![("reason", reason.to_string())], n.load(Relaxed))),
    )?;
    counters(
        enc,
        "chimed_xdp_receive_times_total",
        "Where XDP requests' receive times came from: program (read by the XDP program as it \
         saw the frame, the usual) or worker (read once per batch, the program's reading \
         missing).",
        [
            ("program", &s.rx_times_from_program),
            ("worker", &s.rx_times_from_worker),
        ]
        .map(|(source, n)| (vec![("source", source.to_string())], n.load(Relaxed))),
    )?;
    // Summed over the CPUs from the kernel's map; a read that fails leaves the family out.
    if let Some(counts) = x.driver.as_ref().and_then(|d| d.counts().ok()) {
        counters(
            enc,
            "chimed_xdp_driver_frames_total",
            "What the program in the driver did with each frame to a served address \
             (--xdp-in-driver): answered, denied (dropped unanswered: --allow/--deny), or why it \
             handed the frame on to the AF_XDP workers (not_ntp, length, malformed, mode, \
             version, interleaved, upgrade, off), or, over --ratelimit, answered with a KoD (kod) \
             or dropped (rate_limited).",
            (counts.into_iter()).map(|(o, n)| (vec![("outcome", o.name().to_string())], n)),
        )?;
    }
    Ok(())
}

/// One series per worker and note in `notes`, labelled `label` with the note's value there.
fn by_note<'a>(
    counts: impl Iterator<Item = &'a (&'a Arc<Published>, PublishedCounts)> + 'a,
    label: &'static str,
    notes: &'a [(&'static str, Note)],
) -> impl Iterator<Item = (Labels, u64)> + 'a {
    counts.flat_map(move |(w, c)| {
        notes.iter().map(move |(value, note)| {
            let mut labels = worker_labels(w);
            labels.push((label, (*value).to_string()));
            (labels, c.notes[note.index()])
        })
    })
}

/// Every version a Roughtime reply is counted under, as `chimed_roughtime_replies_total` labels
/// it, with its note: the protocol's, and the experimental ML-DSA-44 suite's where built in.
fn reply_versions() -> impl Iterator<Item = (&'static str, Note)> {
    let versions = Version::ALL
        .into_iter()
        .map(|v| (v.label(), Note::Roughtime(v)));
    #[cfg(feature = "mldsa")]
    let versions = versions.chain([("0x90000001", Note::Mldsa44)]);
    versions
}

#[cfg(test)]
mod tests {
    use chime_ntp::ServerState;

    use super::*;
    use crate::ntp::worker::testing::shared;

    /// An NTP service as it registers itself: one worker, so that the per-worker families have a
    /// series, and the upstream, unsynchronised and never polled.
    fn registry() -> prometheus_client::registry::Registry {
        let ntp = shared(ServerState::unsynchronised(), &[]);
        let _worker = ntp.workers.register("ipv4", 0);
        let mut registry = Registry::new(0);
        registry.workers(ntp.workers.clone());
        registry.encoded(
            "upstream",
            ntp.clock.clone(),
            crate::clock::upstream::encode,
        );
        registry.finish()
    }

    #[test]
    fn routes() {
        let s = registry();
        for (method, uri, expected) in [
            ("GET", "/metrics", 200),
            ("GET", "/metrics?a=b", 200),
            ("HEAD", "/metrics", 200),
            ("GET", "/", 404),
            ("GET", "/metricsx", 404),
            ("PUT", "/metrics", 405),
            ("POST", "/metrics", 405),
        ] {
            let request = hyper::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap();
            assert_eq!(respond(&request, &s).status(), expected, "{method} {uri}");
        }
        // Unsynchronised upstream, never polled: no reply age, served as unsynchronised.
        let page = render(&s);
        assert!(
            page.contains("chimed_served_synchronised{service=\"upstream\"} 0\n"),
            "{page}"
        );
        // OpenMetrics: a counter described without its _total, and the page's end marked.
        assert!(
            page.contains(
                "# TYPE chimed_requests_received counter\nchimed_requests_received_total{"
            ),
            "{page}"
        );
        assert!(page.ends_with("# EOF\n"), "{page}");
        assert!(
            !page.contains("chimed_upstream_last_reply_age_seconds"),
            "{page}"
        );
    }
}
