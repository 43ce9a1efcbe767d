//! Cluster status, health and readiness.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::records_of;

/// `Ok` when every running node answers `/readyz` with 200.
async fn every_running_node_ready(c: &Cluster) -> Result<(), String> {
    for id in c.running_ids() {
        let resp = c.get_readyz(id).await?;
        if resp.status() != StatusCode::OK {
            return Err(format!("node {id} /readyz: {}", resp.status()));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_health_and_readiness() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let lurl = c.url(leader);
    let http = c.http();
    let cl = &c;

    // Settled: every node ready, and the leader knows every member's replication progress.
    c.wait_for(
        "every node ready and replicated",
        Duration::from_secs(20),
        move || async move {
            every_running_node_ready(cl).await?;
            let status = cl.status(leader).await?;
            if status.members.iter().any(|m| m.matched_index.is_none()) {
                return Err(format!("leader's members: {:?}", status.members));
            }
            Ok(())
        },
    )
    .await;

    let leader_status = c.status(leader).await.unwrap_or_else(|e| c.fail(&e));
    for id in c.ids() {
        let raw: Value = c.get_json(id, "/v1/cluster").await;
        for field in [
            "node_id",
            "leader_id",
            "leader_url",
            "term",
            "commit_index",
            "last_applied",
            "members",
            "snapshot",
        ] {
            assert!(
                raw.get(field).is_some(),
                "node {id}: /v1/cluster lacks {field:?}: {raw}"
            );
        }
        for member in raw["members"].as_array().expect("members is an array") {
            for field in ["id", "url", "voter", "matched_index"] {
                assert!(
                    member.get(field).is_some(),
                    "node {id}: a member lacks {field:?}: {raw}"
                );
            }
        }
        let status = c.status(id).await.unwrap_or_else(|e| c.fail(&e));
        assert_eq!(status.node_id, id);
        assert_eq!(status.leader_id, Some(leader), "node {id}: {status:?}");
        assert_eq!(
            status.leader_url.as_deref(),
            Some(lurl.as_str()),
            "node {id}: {status:?}"
        );
        assert_eq!(status.term, leader_status.term, "node {id}: {status:?}");
        assert!(status.term >= 1, "{status:?}");
        assert!(status.commit_index >= 1, "node {id}: {status:?}");
        assert!(
            status.last_applied <= status.commit_index,
            "node {id}: {status:?}"
        );
        let members: Vec<(u64, String, bool)> = status
            .members
            .iter()
            .map(|m| (m.id, m.url.clone(), m.voter))
            .collect();
        let expected: Vec<(u64, String, bool)> =
            c.ids().into_iter().map(|i| (i, c.url(i), true)).collect();
        assert_eq!(members, expected, "node {id}: members");
        if id == leader {
            let own = status.matched_index(leader);
            assert!(
                own >= Some(status.commit_index),
                "leader's own log end below commit: {status:?}"
            );
            for m in &status.members {
                assert!(
                    m.matched_index <= own,
                    "member {} is ahead of the leader: {status:?}",
                    m.id
                );
            }
        }
        let resp = c
            .send(http.get(format!("{}/healthz", c.url(id))), "GET /healthz")
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "node {id} /healthz");
        let resp = c
            .send(http.get(format!("{}/readyz", c.url(id))), "GET /readyz")
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "node {id} /readyz");
    }

    // With no leader at all (every node crashed, one follower back alone): not ready, writes
    // answer 503 no_leader with Retry-After, reads are still served from local state.
    c.create_topic("nl").await;
    c.wait_converged("nl").await;
    let lone = c.follower_id().await;
    c.kill_all();
    c.restart(lone).await;
    let surl = c.url(lone);
    c.wait_for(
        "the lone node to know no leader",
        Duration::from_secs(20),
        || {
            let request = http.get(format!("{surl}/v1/cluster")).send();
            async move {
                let status: raftq_client::api::ClusterStatus = request
                    .await
                    .map_err(|e| e.to_string())?
                    .json()
                    .await
                    .map_err(|e| e.to_string())?;
                match status.leader_id {
                    None => Ok(()),
                    Some(l) => Err(format!("still names leader {l} in term {}", status.term)),
                }
            }
        },
    )
    .await;
    let resp = c
        .send(
            http.get(format!("{surl}/readyz")),
            "GET /readyz without a leader",
        )
        .await;
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "/readyz without a leader"
    );
    let resp = c
        .send(
            http.put(format!("{surl}/v1/topics/nol")).json(&json!({})),
            "PUT without a leader",
        )
        .await;
    c.expect_no_leader(resp, "a topic PUT with no leader").await;
    let resp = c
        .send(
            http.post(format!("{surl}/v1/topics/nl/records"))
                .json(&records_of(&["x"])),
            "publish without a leader",
        )
        .await;
    c.expect_no_leader(resp, "a publish with no leader").await;
    let page = c.read(lone, "nl", "from=first").await;
    assert!(
        page.records.is_empty() && page.high_watermark == 0,
        "{page:?}"
    );

    // Everyone back: a leader again, every node ready.
    for id in c.ids().into_iter().filter(|id| *id != lone) {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    c.wait_for(
        "every node ready again",
        Duration::from_secs(20),
        move || every_running_node_ready(cl),
    )
    .await;
    c.consistent_log("nl").await;
}
