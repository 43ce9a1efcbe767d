//! `GET /metrics` on a real three-node cluster: the exposition parses as Prometheus text
//! (strictly: names, labels, values, one TYPE per family, histograms whose buckets add up),
//! and its counters and gauges follow a workload (publishes, pulls, acks, a snapshot, a
//! leadership transfer) with the same numbers the API reports.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::Cluster;
use serde_json::{json, Value};

/// One sample: its family's name, its labels, its value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: the declared type of every family, and every sample.
#[derive(Debug, Default)]
struct Exposition {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    /// Every sample of `name` whose labels include `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The value of the one sample with this name whose labels include `labels`; None when
    /// there is none, a failure when there are several.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().map(|s| s.value)
    }

    /// Like [`Exposition::get`], but the sample must exist.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
    }

    /// The sum over every sample of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }
}

fn is_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':');
    matches!(chars.next(), Some(c) if first_ok(c))
        && chars.all(|c| first_ok(c) || c.is_ascii_digit())
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse::<f64>().map_err(|e| format!("value {s:?}: {e}")),
    }
}

/// `{a="x",b="y"}` (the braces already removed), with the format's escapes.
fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or(format!("label without '=' in {s:?}"))?;
        let name = &rest[..eq];
        if !is_name(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        let after = &rest[eq + 1..];
        let mut chars = after.char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label {name} value not quoted in {s:?}"));
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => value.push('\n'),
                (true, '\\') => value.push('\\'),
                (true, '"') => value.push('"'),
                (true, c) => return Err(format!("bad escape \\{c} in {s:?}")),
                (false, '\\') => {
                    escaped = true;
                    continue;
                }
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, c) => value.push(c),
            }
            escaped = false;
        }
        let end = end.ok_or(format!("unterminated label value in {s:?}"))?;
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice in {s:?}"));
        }
        rest = &after[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.is_empty() {
            return Err(format!("junk after a label in {s:?}"));
        }
    }
    Ok(labels)
}

/// The family a sample belongs to: histogram and summary samples carry a suffix.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .find(|base| {
            matches!(
                types.get(*base).map(String::as_str),
                Some("histogram" | "summary")
            )
        })
}

/// Parses the text format (0.0.4) strictly: every line is a comment, HELP, TYPE or sample; a
/// family's TYPE comes once and before its samples; no series appears twice; every histogram
/// has cumulative buckets ending in `+Inf` equal to its `_count`.
fn parse(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut series = HashSet::new();
    let mut helped = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !is_name(name, true) {
                        return Err(at("bad family name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(at(format!("unknown type {kind}")));
                    }
                    if exp.types.insert(name.into(), kind.into()).is_some() {
                        return Err(at("second TYPE for a family".into()));
                    }
                }
                (Some("HELP"), Some(name), _) if !helped.insert(name.to_string()) => {
                    return Err(at("second HELP for a family".into()));
                }
                _ => {} // a plain comment
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series_text, value_text) = match line.find('{') {
            Some(_) => {
                let close = line
                    .rfind('}')
                    .ok_or_else(|| at("no closing brace".into()))?;
                (&line[..=close], line[close + 1..].trim())
            }
            None => {
                let sp = line.find(' ').ok_or_else(|| at("no value".into()))?;
                (&line[..sp], line[sp + 1..].trim())
            }
        };
        let (name, labels) = match series_text.find('{') {
            Some(open) => (
                &series_text[..open],
                parse_labels(&series_text[open + 1..series_text.len() - 1]).map_err(at)?,
            ),
            None => (series_text, BTreeMap::new()),
        };
        if !is_name(name, true) {
            return Err(at("bad metric name".into()));
        }
        // A value, optionally followed by a timestamp.
        let mut fields = value_text.split_whitespace();
        let value = parse_value(fields.next().ok_or_else(|| at("no value".into()))?).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|e| at(format!("timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(at("junk after the value".into()));
        }
        let family =
            family_of(name, &exp.types).ok_or_else(|| at("sample before its TYPE".into()))?;
        let kind = &exp.types[family];
        if kind == "counter" && (value < 0.0 || value.is_nan()) {
            return Err(at("a counter below zero".into()));
        }
        if !series.insert(format!("{name}{labels:?}")) {
            return Err(at("the same series twice".into()));
        }
        exp.samples.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    check_histograms(&exp)?;
    Ok(exp)
}

fn check_histograms(exp: &Exposition) -> Result<(), String> {
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        // Group the buckets by their labels other than `le`.
        let mut groups: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for s in exp
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut labels = s.labels.clone();
            let le = labels
                .remove("le")
                .ok_or(format!("{family}: a bucket without le"))?;
            groups
                .entry(format!("{labels:?}"))
                .or_default()
                .push((parse_value(&le)?, s.value));
        }
        for (labels, mut buckets) in groups {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!(
                    "{family}{labels}: buckets not cumulative: {buckets:?}"
                ));
            }
            let (le, inf) = *buckets.last().unwrap();
            if le != f64::INFINITY {
                return Err(format!("{family}{labels}: no +Inf bucket"));
            }
            let count = exp
                .samples
                .iter()
                .find(|s| {
                    s.name == format!("{family}_count") && format!("{:?}", s.labels) == labels
                })
                .ok_or(format!("{family}{labels}: no _count"))?;
            if count.value != inf {
                return Err(format!(
                    "{family}{labels}: _count {} but +Inf bucket {inf}",
                    count.value
                ));
            }
        }
    }
    Ok(())
}

async fn scrape(c: &Cluster, id: u64) -> Exposition {
    let resp = c.call(reqwest::Method::GET, id, "/metrics").await;
    assert_eq!(resp.status().as_u16(), 200, "GET /metrics on node {id}");
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "content type {content_type:?}"
    );
    let text = resp.text().await.expect("metrics body");
    parse(&text).unwrap_or_else(|e| panic!("node {id}: not Prometheus text: {e}\n{text}"))
}

#[test]
fn the_parser_refuses_what_prometheus_would() {
    let good = "# HELP a_total x\n# TYPE a_total counter\na_total{t=\"q\\\"x\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                h_sum 3.5\nh_count 2\n";
    let exp = parse(good).expect("valid");
    assert_eq!(exp.value("a_total", &[("t", "q\"x")]), 3.0);
    for bad in [
        "a 1\n",                                 // no TYPE
        "# TYPE a gauge\na{t=\"x} 1\n",          // unterminated
        "# TYPE a gauge\na{t=x} 1\n",            // unquoted
        "# TYPE a gauge\na one\n",               // not a number
        "# TYPE a gauge\na 1\na 2\n",            // twice
        "# TYPE a gauge\n# TYPE a gauge\na 1\n", // two TYPEs
        "# TYPE a counter\na -1\n",              // negative counter
        "# TYPE 1a gauge\n1a 1\n",               // bad name
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_follow_a_workload() {
    let c = Cluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;

    // Every node serves the exposition, without a token, and agrees on who leads (a node
    // learns its role a moment after the leader is known: wait for it).
    for id in c.ids() {
        let m = scrape(&c, id).await;
        assert_eq!(m.value("raftq_node_id", &[]), id as f64);
        let role = if id == leader { "leader" } else { "follower" };
        c.wait_for(
            &format!("node {id}'s role"),
            Duration::from_secs(10),
            || async {
                let m = scrape(&c, id).await;
                let states: Vec<String> = m
                    .samples
                    .iter()
                    .filter(|s| s.name == "raftq_raft_state" && s.value == 1.0)
                    .map(|s| s.labels["state"].clone())
                    .collect();
                let leader_seen = m.value("raftq_raft_leader_id", &[]);
                if states == [role] && leader_seen == leader as f64 {
                    Ok(())
                } else {
                    Err(format!("states {states:?}, leader {leader_seen}"))
                }
            },
        )
        .await;
    }
    let before = scrape(&c, leader).await;

    c.create_topic("orders").await;
    c.subscribe_from_first("orders", "billing").await;
    let publishes = 5;
    for batch in 0..publishes {
        let values: Vec<String> = (0..4).map(|i| format!("order-{batch}-{i}")).collect();
        c.publish_values("orders", &values).await;
    }
    // Pull 6, ack the first 4: 2 stay in flight.
    c.pull_and_ack("orders", "billing", 6, 4).await;
    c.wait_converged("orders").await;

    let after = scrape(&c, leader).await;
    let topic = [("topic", "orders")];
    let sub = [("topic", "orders"), ("subscription", "billing")];
    assert_eq!(after.value("raftq_topic_published_total", &topic), 20.0);
    assert_eq!(after.value("raftq_topic_records", &topic), 20.0);
    assert_eq!(after.value("raftq_topic_next_offset", &topic), 20.0);
    assert!(after.value("raftq_topic_stored_bytes", &topic) > 0.0);
    // The subscription's numbers are the API's numbers.
    let report: Value = c
        .get_json(leader, "/v1/topics/orders/subscriptions/billing")
        .await;
    for (metric, field) in [
        ("raftq_subscription_cursor", "cursor"),
        ("raftq_subscription_backlog", "backlog"),
        ("raftq_subscription_in_flight", "in_flight"),
        ("raftq_subscription_delivered_total", "delivered"),
        ("raftq_subscription_acked_total", "acked"),
        ("raftq_subscription_redelivered_total", "redelivered"),
        ("raftq_subscription_dead_lettered_total", "dead_lettered"),
    ] {
        assert_eq!(
            after.value(metric, &sub),
            report[field].as_f64().expect(field),
            "{metric} vs {field} in {report}"
        );
    }
    assert_eq!(after.value("raftq_subscription_acked_total", &sub), 4.0);
    assert_eq!(after.value("raftq_subscription_in_flight", &sub), 2.0);
    assert_eq!(after.value("raftq_subscription_backlog", &sub), 14.0);
    assert_eq!(after.value("raftq_subscription_lag", &sub), 16.0);
    // Followers apply the same state: their per-topic numbers match.
    for id in c.ids() {
        let m = scrape(&c, id).await;
        assert_eq!(
            m.value("raftq_topic_published_total", &topic),
            20.0,
            "node {id}"
        );
        assert_eq!(
            m.value("raftq_subscription_acked_total", &sub),
            4.0,
            "node {id}"
        );
    }

    // Event counters moved with the work.
    let publish_route = [
        ("route", "/v1/topics/{topic}/records"),
        ("method", "POST"),
        ("status", "200"),
    ];
    let posted = after.sum("raftq_http_requests_total", &publish_route)
        - before.sum("raftq_http_requests_total", &publish_route);
    assert_eq!(posted, publishes as f64, "publishes counted on the leader");
    assert!(
        after.sum(
            "raftq_http_request_duration_seconds_count",
            &[("route", "/v1/topics/{topic}/records"), ("method", "POST")]
        ) >= publishes as f64
    );
    for moved in [
        "raftq_log_fsyncs_total",
        "raftq_log_fsync_seconds_count",
        "raftq_log_append_seconds_count",
        "raftq_entry_commands_count",
        "raftq_raft_commit_index",
        "raftq_raft_applied_index",
        "raftq_raft_last_log_index",
    ] {
        let (b, a) = (
            before.get(moved, &[]).unwrap_or(0.0),
            after.value(moved, &[]),
        );
        assert!(a > b, "{moved} did not move: {b} then {a}");
    }
    // Commands per entry: at least one per publish, subscription, pull and ack.
    assert!(after.value("raftq_entry_commands_sum", &[]) >= (publishes + 4) as f64);
    // The leader knows how far every member has matched.
    for id in c.ids() {
        let matched = after.value(
            "raftq_raft_member_matched_index",
            &[("member", &id.to_string())],
        );
        assert!(matched > 0.0, "member {id} matched {matched}");
    }

    // A snapshot: its size, index and build duration appear.
    c.leader_json(reqwest::Method::POST, "/v1/cluster/snapshot", json!({}))
        .await;
    let snap = scrape(&c, leader).await;
    assert!(snap.value("raftq_snapshot_index", &[]) > 0.0);
    assert!(snap.value("raftq_snapshot_size_bytes", &[]) > 0.0);
    assert!(snap.value("raftq_snapshot_build_seconds_count", &[]) >= 1.0);

    // A leadership transfer: the new leader counts the change and reports its role.
    let to = c.ids().into_iter().find(|id| *id != leader).unwrap();
    let changes_before = scrape(&c, to)
        .await
        .get("raftq_leader_changes_total", &[])
        .unwrap_or(0.0);
    c.leader_json(
        reqwest::Method::POST,
        "/v1/cluster/transfer-leader",
        json!({"to": to}),
    )
    .await;
    c.wait_for(
        "the new leader's metrics",
        Duration::from_secs(20),
        || async {
            let m = scrape(&c, to).await;
            let leads = m.value("raftq_raft_state", &[("state", "leader")]) == 1.0;
            let counted = m.value("raftq_leader_changes_total", &[]) > changes_before;
            if leads && counted {
                Ok(())
            } else {
                Err(format!(
                    "state leader {}, leader changes {}",
                    leads,
                    m.value("raftq_leader_changes_total", &[])
                ))
            }
        },
    )
    .await;
}
