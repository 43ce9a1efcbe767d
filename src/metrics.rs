//! Prometheus metrics at `GET /metrics` (text format 0.0.4).
//!
//! Two kinds:
//! - Event metrics, recorded where things happen through the `metrics` facade: HTTP requests
//!   (route, method, status, latency), log appends and WAL fsyncs, commands and bytes per Raft
//!   entry, snapshots built and installed, leader changes. The Prometheus recorder is installed
//!   once per process by [`install`]; without it (unit tests) recording does nothing.
//! - State metrics, read at scrape time from the node's status and applied state: term, role,
//!   indexes, and per topic and subscription the counts of the reports. They are rendered
//!   directly, so a deleted topic's series disappear with it.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Instant;

use crate::node::{Node, Role};
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets, in seconds: 100 µs to 10 s.
const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Size buckets (commands per entry, bytes per entry).
const SIZES: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];

/// Installs the process's Prometheus recorder (once; later calls do nothing).
pub fn install() {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_commands".into()), SIZES))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_bytes".into()), SIZES));
        let recorder = match builder {
            Ok(b) => b.build_recorder(),
            Err(e) => {
                tracing::warn!("metrics buckets refused ({e}); histograms become summaries");
                PrometheusBuilder::new().build_recorder()
            }
        };
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
        }
        describe();
        handle
    });
}

fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        "raftq_http_requests_total",
        "HTTP requests answered, by route, method and status"
    );
    describe_histogram!(
        "raftq_http_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's arrival to its answer, by route and method"
    );
    describe_histogram!(
        "raftq_log_append_seconds",
        Unit::Seconds,
        "Time from a log append's write to its fsync being reported to Raft"
    );
    describe_histogram!(
        "raftq_log_fsync_seconds",
        Unit::Seconds,
        "Duration of one WAL fsync"
    );
    describe_counter!(
        "raftq_log_fsyncs_total",
        "WAL fsyncs (each covers every append queued before it)"
    );
    describe_histogram!(
        "raftq_entry_commands",
        "Client commands per Raft entry (group commit)"
    );
    describe_histogram!(
        "raftq_entry_bytes",
        Unit::Bytes,
        "Encoded client commands per Raft entry"
    );
    describe_counter!(
        "raftq_leader_changes_total",
        "Leader changes seen by this node"
    );
    describe_histogram!(
        "raftq_snapshot_build_seconds",
        Unit::Seconds,
        "Duration of building a snapshot"
    );
    describe_histogram!(
        "raftq_snapshot_install_seconds",
        Unit::Seconds,
        "Duration of installing a received snapshot"
    );
}

/// `GET /metrics`, open like `/healthz`: it carries counts and topic names, never records.
pub fn router(node: crate::node::AppState) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let node = node.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    render(&node),
                )
            }
        }),
    )
}

/// Counts every request and its latency, by the route it matched (never the raw path, so
/// the number of series stays bounded).
pub async fn http_layer(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().as_str().to_string();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::histogram!(
        "raftq_http_request_duration_seconds",
        "route" => route.clone(),
        "method" => method.clone()
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        "raftq_http_requests_total",
        "route" => route,
        "method" => method,
        "status" => status
    )
    .increment(1);
    resp
}

/// The whole exposition: state metrics read now, then the recorded ones.
pub fn render(node: &Node) -> String {
    let mut out = String::with_capacity(16 << 10);
    raft_metrics(node, &mut out);
    process_metrics(&mut out);
    state_metrics(node, &mut out);
    if let Some(handle) = HANDLE.get() {
        out.push_str(&handle.render());
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn raft_metrics(node: &Node, out: &mut String) {
    let status = node.status();
    let gauges: [(&str, &str, u64); 6] = [
        ("raftq_node_id", "This node's id", status.id),
        ("raftq_raft_term", "Current Raft term", status.term),
        (
            "raftq_raft_leader_id",
            "Id of the leader this node knows (0: none)",
            status.leader.unwrap_or(0),
        ),
        (
            "raftq_raft_last_log_index",
            "Last index in this node's log",
            status.last_log_index.unwrap_or(0),
        ),
        (
            "raftq_raft_commit_index",
            "Highest index this node knows committed",
            status.committed,
        ),
        (
            "raftq_raft_applied_index",
            "Highest index applied to the state machine",
            status.applied,
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {value}");
    }
    family(
        out,
        "raftq_raft_state",
        "gauge",
        "1 for this node's Raft state (leader, follower, candidate, learner), 0 for the others",
    );
    for role in Role::ALL {
        let _ = writeln!(
            out,
            "raftq_raft_state{{state=\"{}\"}} {}",
            role.name(),
            u8::from(status.role == role)
        );
    }
    family(
        out,
        "raftq_raft_member_matched_index",
        "gauge",
        "Last log index known replicated to each member (on the leader only)",
    );
    if let Some(replication) = &status.replication {
        for (id, matched) in replication {
            let index = matched.unwrap_or(0);
            let _ = writeln!(
                out,
                "raftq_raft_member_matched_index{{member=\"{id}\"}} {index}"
            );
        }
    }
    let (snap_index, snap_bytes) = node.snapshot_info().unwrap_or((0, 0));
    family(
        out,
        "raftq_snapshot_index",
        "gauge",
        "Last log index in the current snapshot",
    );
    let _ = writeln!(out, "raftq_snapshot_index {snap_index}");
    family(
        out,
        "raftq_snapshot_size_bytes",
        "gauge",
        "Size of the current snapshot file",
    );
    let _ = writeln!(out, "raftq_snapshot_size_bytes {snap_bytes}");
}

/// The process's open files and its limit on them, under the names Prometheus's own process
/// collectors use: every log segment holds a file open, and a node that runs out of files stops
/// (docs/operations.md, "Open files"), so `process_open_fds / process_max_fds` is the ratio to
/// alert on. A figure that cannot be read is left out.
fn process_metrics(out: &mut String) {
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        family(out, "process_open_fds", "gauge", "Open file descriptors");
        let _ = writeln!(out, "process_open_fds {}", fds.count());
    }
    if let Ok(limit) = open_files_limit() {
        family(
            out,
            "process_max_fds",
            "gauge",
            "Most file descriptors the process may open (its soft limit)",
        );
        let _ = writeln!(out, "process_max_fds {}", limit.rlim_cur);
    }
}

/// The process's limits on open files (soft: `rlim_cur`, hard: `rlim_max`).
pub fn open_files_limit() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

/// Per topic and per subscription, as of the node's applied state (the reports' numbers).
fn state_metrics(node: &Node, out: &mut String) {
    node.read(|view| state_families(&view.state, out));
}

/// The families of [`state_metrics`], from one applied state.
fn state_families(state: &crate::state::SmState, out: &mut String) {
    type TopicGet = fn(&crate::state::TopicMeta) -> u64;
    let topics: [(&str, &str, &str, TopicGet); 6] = [
        (
            "raftq_topic_published_total",
            "counter",
            "Records appended to the topic",
            |t| t.counters.published,
        ),
        (
            "raftq_topic_deduplicated_total",
            "counter",
            "Records of re-sent idempotent batches answered as duplicates",
            |t| t.counters.deduplicated,
        ),
        ("raftq_topic_records", "gauge", "Records stored", |t| {
            t.records()
        }),
        (
            "raftq_topic_stored_bytes",
            "gauge",
            "Bytes of the stored records",
            |t| t.bytes,
        ),
        (
            "raftq_topic_next_offset",
            "gauge",
            "Offset the next record gets",
            |t| t.next_offset,
        ),
        (
            "raftq_topic_discarded_retention_total",
            "counter",
            "Records removed by retention",
            |t| t.counters.discarded_retention,
        ),
    ];
    for (name, kind, help, get) in topics {
        family(out, name, kind, help);
        for (topic, meta) in &state.topics {
            let _ = writeln!(out, "{name}{{topic=\"{topic}\"}} {}", get(meta));
        }
    }
    type SubGet = fn(&raftq_client::api::SubscriptionReport) -> u64;
    let subs: [(&str, &str, &str, SubGet); 8] = [
        (
            "raftq_subscription_backlog",
            "gauge",
            "Records neither done nor leased",
            |s| s.backlog,
        ),
        (
            "raftq_subscription_in_flight",
            "gauge",
            "Records leased now",
            |s| s.in_flight,
        ),
        ("raftq_subscription_cursor", "gauge", "The ack floor", |s| {
            s.cursor
        }),
        (
            "raftq_subscription_delivered_total",
            "counter",
            "Deliveries",
            |s| s.delivered,
        ),
        (
            "raftq_subscription_acked_total",
            "counter",
            "Records acked",
            |s| s.acked,
        ),
        (
            "raftq_subscription_redelivered_total",
            "counter",
            "Deliveries of a record delivered before",
            |s| s.redelivered,
        ),
        (
            "raftq_subscription_dead_lettered_total",
            "counter",
            "Records dead-lettered or discarded by refusal",
            |s| s.dead_lettered,
        ),
        (
            "raftq_subscription_expired_leases_total",
            "counter",
            "Leases that expired unacked",
            |s| s.expired_leases,
        ),
    ];
    let reports: Vec<(&str, &str, raftq_client::api::SubscriptionReport, u64)> = state
        .topics
        .iter()
        .flat_map(|(topic, meta)| {
            state.subs_of(topic).map(move |sub| {
                (
                    topic.as_str(),
                    sub.name.as_str(),
                    crate::api::reports::subscription_report(sub, meta.next_offset),
                    meta.next_offset,
                )
            })
        })
        .collect();
    for (name, kind, help, get) in subs {
        family(out, name, kind, help);
        for (topic, sub, report, _) in &reports {
            let _ = writeln!(
                out,
                "{name}{{topic=\"{topic}\",subscription=\"{sub}\"}} {}",
                get(report)
            );
        }
    }
    family(
        out,
        "raftq_subscription_lag",
        "gauge",
        "Records between the cursor and the topic's end",
    );
    for (topic, sub, report, next) in &reports {
        let _ = writeln!(
            out,
            "raftq_subscription_lag{{topic=\"{topic}\",subscription=\"{sub}\"}} {}",
            next.saturating_sub(report.cursor)
        );
    }
}
