//! Changing the cluster under load (API.md, "Cluster and operations"): grow from three voters
//! to five, shrink back to three, move leadership, then kill a voter. Nothing acknowledged is
//! lost and writes keep flowing; a removed node id is never accepted again.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{wait_acks, Cluster, Load};
use raftq_client::api::{ClusterStatus, TopicConfig, TransferLeaderResponse};
use serde_json::{json, Value};

/// The leader as the running members see it (a node not yet added sees none).
async fn leader(c: &Cluster) -> u64 {
    for _ in 0..200 {
        for id in c.running_ids() {
            if let Ok(s) = c.status(id).await {
                if let Some(l) = s.leader_id.filter(|l| c.is_running(*l)) {
                    return l;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.fail("no running node names a running leader")
}

async fn change(
    c: &Cluster,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let leader = leader(c).await;
    let mut req = c
        .http()
        .request(method.clone(), format!("{}{path}", c.url(leader)));
    if let Some(body) = body {
        req = req.json(&body);
    }
    c.send(req, &format!("{method} {path}")).await
}

/// `POST {path}` with `body` to the leader.
async fn post(c: &Cluster, path: &str, body: Value) -> reqwest::Response {
    change(c, reqwest::Method::POST, path, Some(body)).await
}

/// Waits until `load` has 100 more acknowledged publishes than now.
async fn wait_100_more_acks(c: &Cluster, load: &Load) {
    let target = load.acked() + 100;
    wait_acks(c, load, target, Duration::from_secs(30)).await;
}

async fn expect_status(c: &Cluster, resp: reqwest::Response, what: &str) -> ClusterStatus {
    c.json_of(resp, 200, what).await
}

fn voters(s: &ClusterStatus) -> BTreeSet<u64> {
    s.members.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

fn learners(s: &ClusterStatus) -> BTreeSet<u64> {
    s.members
        .iter()
        .filter(|m| !m.voter)
        .map(|m| m.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_to_five_shrink_to_three_and_lose_a_voter_under_load() {
    let c = Cluster::start_with_spares(3, 2, &[]).await;
    let topic = "members";
    let client = c.client_with_topic(topic).await;
    let load = Load::start(&client, topic, 3, 100_000);
    wait_acks(&c, &load, 100, Duration::from_secs(30)).await;

    // Grow: two new nodes join as learners, catch up, then become voters.
    for id in [4, 5] {
        c.restart(id).await;
        let resp = post(&c, "/v1/cluster/nodes", json!({"id": id, "url": c.url(id)})).await;
        let s = expect_status(&c, resp, &format!("add node {id}")).await;
        assert!(learners(&s).contains(&id), "node {id} is a learner: {s:?}");
    }
    wait_100_more_acks(&c, &load).await;
    let resp = post(&c, "/v1/cluster/voters", json!({"ids": [1, 2, 3, 4, 5]})).await;
    let s = expect_status(&c, resp, "five voters").await;
    assert_eq!(voters(&s), BTreeSet::from([1, 2, 3, 4, 5]));
    wait_100_more_acks(&c, &load).await;

    // Leadership moves to a new voter on request.
    let resp = post(&c, "/v1/cluster/transfer-leader", json!({"to": 4})).await;
    let moved: TransferLeaderResponse = c.json_of(resp, 200, "transfer to 4").await;
    assert_eq!(moved.leader_id, 4);
    assert_eq!(leader(&c).await, 4);
    wait_100_more_acks(&c, &load).await;

    // Shrink: two of the first voters leave, then are removed and stopped.
    let resp = post(&c, "/v1/cluster/voters", json!({"ids": [1, 4, 5]})).await;
    let s = expect_status(&c, resp, "three voters").await;
    assert_eq!(voters(&s), BTreeSet::from([1, 4, 5]));
    assert_eq!(
        learners(&s),
        BTreeSet::from([2, 3]),
        "leavers stay learners"
    );
    for id in [2, 3] {
        let resp = change(
            &c,
            reqwest::Method::DELETE,
            &format!("/v1/cluster/nodes/{id}"),
            None,
        )
        .await;
        let s = expect_status(&c, resp, &format!("remove node {id}")).await;
        assert!(s.members.iter().all(|m| m.id != id), "{s:?}");
        c.kill(id);
    }
    wait_100_more_acks(&c, &load).await;

    // A removed id is never reused.
    let resp = post(&c, "/v1/cluster/nodes", json!({"id": 2, "url": c.url(2)})).await;
    let (problem, _) = c
        .expect_problem(resp, 400, "invalid_argument", "re-adding node 2")
        .await;
    assert!(problem.detail.contains("never reused"), "{problem:?}");
    // Bad requests change nothing.
    for (path, body) in [
        ("/v1/cluster/voters", json!({"ids": []})),
        ("/v1/cluster/voters", json!({"ids": [1, 9]})),
        ("/v1/cluster/nodes", json!({"id": 7, "url": "ftp://x"})),
        (
            "/v1/cluster/nodes",
            json!({"id": 0, "url": "http://127.0.0.1:1"}),
        ),
    ] {
        let resp = post(&c, path, body.clone()).await;
        c.expect_problem(resp, 400, "invalid_argument", &format!("{path} {body}"))
            .await;
    }

    // Lose a voter (the leader): the other two elect and keep taking writes.
    let old = c.leader_id().await;
    c.kill(old);
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old);
    wait_100_more_acks(&c, &load).await;
    c.restart(old).await;

    load.stop();
    let histories = load.finish(&c, Duration::from_secs(60)).await;
    let log = c.consistent_log(topic).await;
    let summary = c.check_history(&log, &histories, &[]);
    eprintln!("membership changes under load: {summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_whose_machine_is_gone_is_replaced_under_a_new_id() {
    // Short logs: by the time the new node joins, the log it needs is purged and it must
    // catch up by snapshot.
    let c = Cluster::start_with_spares(
        3,
        1,
        &["--snapshot-logs", "20", "--snapshot-keep-logs", "5"],
    )
    .await;
    let topic = "kept";
    let client = c.client_with_topic(topic).await;
    let before = Load::start(&client, topic, 2, 50)
        .finish(&c, Duration::from_secs(60))
        .await;

    // A follower's machine is gone for good (a node whose disk is lost but that comes back
    // rejoins by itself: tests/storage_faults.rs).
    let lost = c.follower_id().await;
    c.kill(lost);
    std::fs::remove_dir_all(c.data_dir(lost)).expect("wipe the data directory");

    // The documented replacement, with the `raftq cluster` commands: a new id joins, becomes
    // a voter, and the old id is removed.
    let keep: Vec<u64> = (1..=3).filter(|id| *id != lost).collect();
    c.restart(4).await;
    let urls = keep
        .iter()
        .map(|id| c.url(*id))
        .collect::<Vec<_>>()
        .join(",");
    let cli = |args: &[String]| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.arg("cluster").args(args).arg("--url").arg(&urls);
        cmd
    };
    let url4 = c.url(4);
    for (args, want) in [
        (
            vec!["add".to_string(), "4".into(), url4.clone()],
            "caught up",
        ),
        (vec!["promote".to_string(), "4".into()], "voters: ["),
        (vec!["remove".to_string(), lost.to_string()], "removed"),
    ] {
        let (ok, output) = c
            .run_to_exit(cli(&args), &format!("raftq cluster {args:?}"))
            .await;
        assert!(
            ok && output.contains(want),
            "raftq cluster {args:?}: {output}"
        );
    }
    let (ok, output) = c
        .run_to_exit(cli(&["status".into(), "--json".into()]), "status")
        .await;
    assert!(ok, "{output}");
    assert!(
        c.log(4).contains("snapshot installed"),
        "the new node caught up without a snapshot:\n{}",
        common::tail(&c.log(4), 30)
    );
    let s: ClusterStatus = serde_json::from_str(&output)
        .unwrap_or_else(|e| c.fail(&format!("status --json: {e}: {output}")));
    assert_eq!(voters(&s), BTreeSet::from([keep[0], keep[1], 4]));
    assert!(s.members.iter().all(|m| m.id != lost), "{s:?}");
    // A removed id cannot come back, through the CLI either (exit 1, the server's reason).
    let (ok, output) = c
        .run_to_exit(
            cli(&["add".into(), lost.to_string(), c.url(lost)]),
            "re-adding the removed id",
        )
        .await;
    assert!(!ok && output.contains("never reused"), "{output}");

    let after_topic = "after";
    if let Err(e) = client
        .create_topic(after_topic, &TopicConfig::default())
        .await
    {
        c.fail(&format!("creating {after_topic}: {e}"));
    }
    let after = Load::start(&client, after_topic, 2, 50)
        .finish(&c, Duration::from_secs(60))
        .await;
    for (topic, histories) in [(topic, &before), (after_topic, &after)] {
        let log = c.consistent_log(topic).await;
        let summary = c.check_history(&log, histories, &[]);
        eprintln!("{topic}: {summary}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_whose_request_is_dropped_leaves_the_node_able_to_lead() {
    let topic = "moves";
    let (c, client) = Cluster::start_with_client(topic).await;
    let first = leader(&c).await;
    // The client gives up after 300 ms, mid-transfer (the lease wait alone is over a second):
    // the server's handler is dropped with it.
    let url = format!("{}/v1/cluster/transfer-leader", c.url(first));
    let dropped = c
        .http()
        .post(url)
        .json(&json!({}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(
        dropped.is_err(),
        "the transfer answered within 300 ms: {dropped:?}"
    );
    // Whoever leads now, writes flow...
    c.wait_leader(Duration::from_secs(20)).await;
    let ack = client
        .publish_records(topic, vec![raftq_client::api::RecordIn::text("after")])
        .await
        .unwrap_or_else(|e| c.fail(&format!("publish after the dropped transfer: {e}")));
    assert_eq!(ack.first_offset, 0);
    // ...and the node whose transfer was dropped can lead again and take writes.
    let now = leader(&c).await;
    if now != first {
        let moved = client
            .transfer_leader(Some(first))
            .await
            .unwrap_or_else(|e| c.fail(&format!("transfer back to node {first}: {e}")));
        assert_eq!(moved, first);
    }
    for i in 0..20 {
        client
            .publish_records(
                topic,
                vec![raftq_client::api::RecordIn::text(format!(
                    "on {first}: {i}"
                ))],
            )
            .await
            .unwrap_or_else(|e| c.fail(&format!("publish {i} with node {first} leading: {e}")));
    }
    assert_eq!(leader(&c).await, first, "node {first} keeps leading");
}
