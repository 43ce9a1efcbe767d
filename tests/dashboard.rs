//! The dashboard at `/`, loaded in headless Chromium against a real three-node cluster that
//! requires tokens: without a token it asks for one; with a reader's token it shows the
//! cluster and exactly the topics that token sees, with the numbers the API gives, and its
//! charts hold samples. A screenshot is saved (its path is printed).
//!
//! Needs Chromium (Debian's `chromium`; `scripts/test.sh` installs it), found as `chromium`,
//! `chromium-browser` or `google-chrome` on PATH, or named by `RAFTQ_CHROMIUM`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Cluster;
use raftq_client::api::{ClusterStatus, Report};

const ADMIN: &str = "rq_dash_admin_5a0c31";
const READER: &str = "rq_dash_reader_93be7f";

fn tokens_file() -> String {
    common::tokens_toml(&[
        ("admin", ADMIN, "admin:*"),
        ("reader", READER, "consume:orders.*"),
    ])
}

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("RAFTQ_CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no Chromium found (chromium, chromium-browser or google-chrome on PATH, or \
         RAFTQ_CHROMIUM): install Debian's `chromium` package; scripts/test.sh does"
    );
}

/// Runs headless Chromium on `url` with `args`, giving the page `budget_ms` of virtual time
/// (timers run, and network requests complete, before it counts as loaded). Its stdout.
fn headless(url: &str, args: &[&str], budget_ms: u64, profile: &Path) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().expect("wait for chromium").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("chromium output");
            panic!(
                "chromium did not finish within 90 s on {url}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(
        out.status.success(),
        "chromium on {url}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `data-check="KEY"` element's text in a serialized DOM.
fn checks(dom: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = dom;
    while let Some(at) = rest.find("data-check=\"") {
        rest = &rest[at + "data-check=\"".len()..];
        let Some(end) = rest.find('"') else { break };
        let key = rest[..end].to_string();
        let Some(open) = rest.find('>') else { break };
        let Some(close) = rest[open..].find('<') else {
            break;
        };
        let text = rest[open + 1..open + close]
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
        out.insert(key, text.trim().to_string());
    }
    out
}

/// A number as the page shows it (with thousands separators).
fn number(shown: &BTreeMap<String, String>, key: &str) -> u64 {
    let text = shown
        .get(key)
        .unwrap_or_else(|| panic!("the page shows no {key}: {shown:#?}"));
    text.replace(',', "")
        .parse()
        .unwrap_or_else(|e| panic!("{key} shows {text:?}, not a number ({e})"))
}

/// The value of an attribute of the element with `id`, in a serialized DOM.
fn attribute(dom: &str, id: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let key = format!("{name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(tag[from..from + tag[from..].find('"')?].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_what_the_api_says_in_headless_chromium() {
    let c = Cluster::start_with_tokens(3, &tokens_file(), ADMIN).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let follower = c.ids().into_iter().find(|id| *id != leader).unwrap();

    // The assets: served without a token, locked down by their headers.
    for (path, kind) in [
        ("/", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let resp = reqwest::get(format!("{}{path}", c.url(leader)))
            .await
            .expect("GET asset");
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert!(header("content-type").starts_with(kind), "{path}");
        assert!(header("content-security-policy").contains("script-src 'self'"));
        assert_eq!(header("x-content-type-options"), "nosniff");
    }

    // A workload: one topic the reader sees, one it does not.
    c.create_topic("orders.eu").await;
    c.create_topic("payroll").await;
    c.subscribe_from_first("orders.eu", "billing").await;
    for batch in 0..5 {
        let values: Vec<String> = (0..4).map(|i| format!("order-{batch}-{i}")).collect();
        c.publish_values("orders.eu", &values).await;
    }
    c.publish_values("payroll", &["p".into()]).await;
    // Pull 6, ack the first 4: 2 stay in flight.
    c.pull_and_ack("orders.eu", "billing", 6, 4).await;
    c.wait_converged("orders.eu").await;

    let profile = tempfile::tempdir().expect("browser profile dir");

    // Without a token the page asks for one and shows no numbers.
    let dom = headless(
        &format!("{}/", c.url(leader)),
        &["--dump-dom"],
        3000,
        profile.path(),
    );
    assert_eq!(
        attribute(&dom, "login", "hidden"),
        None,
        "login form hidden: {dom}"
    );
    assert!(
        attribute(&dom, "main", "hidden").is_some(),
        "data shown: {dom}"
    );
    let shown = checks(&dom);
    assert_eq!(shown["health"], "no access", "{shown:#?}");
    assert!(shown["status"].contains("401"), "{shown:#?}");

    // With the reader's token (in the fragment, which never reaches the server), on the
    // leader, polling every 250 ms for a few virtual seconds.
    let status_before: ClusterStatus = c.get_json(leader, "/v1/cluster").await;
    let url = format!("{}/#token={READER}&interval=250", c.url(leader));
    let dom = headless(&url, &["--dump-dom"], 4000, profile.path());
    let status_after: ClusterStatus = c.get_json(leader, "/v1/cluster").await;
    let shown = checks(&dom);
    assert_eq!(
        attribute(&dom, "login", "hidden").as_deref(),
        Some(""),
        "{dom}"
    );
    assert_eq!(shown["health"], "healthy · leader", "{shown:#?}");
    assert!(shown["status"].starts_with("updated"), "{shown:#?}");
    assert_eq!(number(&shown, "cluster/node_id"), leader);
    assert_eq!(number(&shown, "cluster/leader_id"), leader);
    assert_eq!(number(&shown, "cluster/term"), status_after.term);
    for (key, before, after) in [
        (
            "cluster/commit_index",
            status_before.commit_index,
            status_after.commit_index,
        ),
        (
            "cluster/last_applied",
            status_before.last_applied,
            status_after.last_applied,
        ),
    ] {
        let n = number(&shown, key);
        assert!(
            (before..=after).contains(&n),
            "{key} shows {n}, API {before}..{after}"
        );
    }
    for m in &status_after.members {
        let role = if m.id == leader { "leader" } else { "follower" };
        assert_eq!(shown[&format!("member/{}/role", m.id)], role, "{shown:#?}");
        let matched = number(&shown, &format!("member/{}/matched_index", m.id));
        assert!(matched <= status_after.commit_index && matched > 0);
    }

    // The reader's topics, with the API's numbers; never a topic it may not see.
    let report: Report = {
        let resp = c
            .send(
                c.http()
                    .get(format!("{}/v1/report", c.url(leader)))
                    .bearer_auth(READER),
                "report as the reader",
            )
            .await;
        c.json_of(resp, 200, "report as the reader").await
    };
    assert_eq!(report.topics.keys().collect::<Vec<_>>(), ["orders.eu"]);
    assert!(
        !shown.keys().any(|k| k.contains("payroll")),
        "a topic the token may not see is shown: {shown:#?}"
    );
    let t = &report.topics["orders.eu"];
    assert_eq!(t.published, 20);
    assert_eq!(number(&shown, "topic/orders.eu/published"), t.published);
    assert_eq!(number(&shown, "topic/orders.eu/records"), t.records);
    assert_eq!(
        number(&shown, "topic/orders.eu/deduplicated"),
        t.deduplicated
    );
    let s = &t.subscriptions["billing"];
    assert_eq!((s.acked, s.in_flight, s.backlog), (4, 2, 14));
    for (field, value) in [
        ("backlog", s.backlog),
        ("in_flight", s.in_flight),
        ("cursor", s.cursor),
        ("delivered", s.delivered),
        ("acked", s.acked),
        ("redelivered", s.redelivered),
        ("expired_leases", s.expired_leases),
        ("dead_lettered", s.dead_lettered),
    ] {
        assert_eq!(
            number(&shown, &format!("sub/orders.eu/billing/{field}")),
            value,
            "{field}"
        );
    }
    // A quiet topic: its rates are zero once two samples exist.
    assert_eq!(shown["topic/orders.eu/published_per_s"], "0.0");
    // The charts hold the samples of the last minutes, one series per topic or subscription.
    for chart in [
        "chart-published",
        "chart-acked",
        "chart-backlog",
        "chart-in-flight",
    ] {
        let samples: u64 = attribute(&dom, chart, "data-samples")
            .unwrap_or_else(|| panic!("{chart} was never drawn"))
            .parse()
            .expect("data-samples");
        assert!(samples >= 2, "{chart} has {samples} samples");
    }
    assert_eq!(
        attribute(&dom, "chart-backlog", "data-series").as_deref(),
        Some("orders.eu/billing")
    );

    // A follower's dashboard says whose follower it is and links to the leader's.
    let url = format!("{}/#token={READER}&interval=250", c.url(follower));
    let dom = headless(&url, &["--dump-dom"], 2000, profile.path());
    let shown = checks(&dom);
    assert_eq!(shown["health"], format!("healthy · follower of {leader}"));
    assert_eq!(number(&shown, "cluster/node_id"), follower);
    assert!(
        dom.contains(&format!("href=\"{}/\"", c.url(leader))),
        "no link to the leader's dashboard"
    );

    // A screenshot, for people.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let png = dir.join("dashboard.png");
    let _ = std::fs::remove_file(&png);
    let url = format!("{}/#token={READER}&interval=250", c.url(leader));
    headless(
        &url,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,1500",
        ],
        4000,
        profile.path(),
    );
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000);
    println!("dashboard screenshot: {}", png.display());
}
