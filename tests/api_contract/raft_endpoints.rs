//! The node-to-node Raft endpoints: the cluster secret, bodies of unknown formats, and
//! snapshots no leader could send.

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use reqwest::StatusCode;

use crate::common::{Cluster, SECRET, SECRET_HEADER};

/// Who is who in a fresh cluster.
struct Roles {
    leader: u64,
    follower: u64,
    /// The leader's term.
    term: u64,
}

/// A three-node cluster with topic `topic`, and its roles.
async fn cluster_with_topic(topic: &str) -> (Cluster, Roles) {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    c.create_topic(topic).await;
    let term = c.status(leader).await.unwrap_or_else(|e| c.fail(&e)).term;
    let roles = Roles {
        leader,
        follower,
        term,
    };
    (c, roles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_endpoints_need_the_cluster_secret() {
    use openraft::raft::VoteRequest;
    use raftq::raft::{TypeConfig, Vote};

    let (
        c,
        Roles {
            leader,
            follower,
            term,
        },
    ) = cluster_with_topic("r").await;
    let http = c.http();

    // A well-formed vote request for a much higher term: if it got through, the node would
    // move to that term and the cluster would hold a new election.
    let vote = VoteRequest::<TypeConfig> {
        vote: Vote::new(term + 100, 99),
        last_log_id: None,
        leadership_transfer: false,
    };
    let vote_body = raftq::codec::encode(&vote).expect("encode a vote request");

    let mut failures = Vec::new();
    for node in [follower, leader] {
        let base = c.url(node);
        for endpoint in ["append", "append-stream", "vote", "pre-vote", "snapshot"] {
            let url = format!("{base}/raft/{endpoint}");
            let attempts = [
                (
                    "wrong secret",
                    http.post(&url)
                        .header(SECRET_HEADER, "not-the-secret-0123456789"),
                ),
                ("no secret", http.post(&url)),
                (
                    "a client bearer token",
                    http.post(&url).header(AUTHORIZATION, "Bearer anything"),
                ),
                (
                    "the secret as a bearer token",
                    http.post(&url)
                        .header(AUTHORIZATION, format!("Bearer {SECRET}")),
                ),
            ];
            for (how, request) in attempts {
                let resp = c.send(request.body(vote_body.clone()), &url).await;
                if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
                    failures.push(format!("node {node} /raft/{endpoint} with {how}: {e}"));
                }
            }
            for garbage in [&b"\xff\xfe\xfd garbage"[..], &b""[..]] {
                let request = http
                    .post(&url)
                    .header(SECRET_HEADER, SECRET)
                    .body(garbage.to_vec());
                let resp = c.send(request, &url).await;
                if endpoint == "append-stream" {
                    // The stream's answer starts before its body is read: garbage ends it with
                    // no answer, and nothing reached Raft.
                    let status = resp.status();
                    let body = resp.bytes().await.unwrap_or_default();
                    if status != StatusCode::OK || !body.is_empty() {
                        failures.push(format!(
                            "node {node} /raft/{endpoint} with garbage {garbage:?}: {status}, \
                             {} bytes of answers",
                            body.len()
                        ));
                    }
                } else if let Err(e) = Cluster::check_problem(resp, 400, "invalid_argument").await {
                    failures.push(format!(
                        "node {node} /raft/{endpoint} with garbage {garbage:?}: {e}"
                    ));
                }
            }
            // The vote, with the secret, in a body format no node reads: refused, not guessed
            // at (read as today's format it would move the node's term).
            let request = http
                .post(&url)
                .header(SECRET_HEADER, SECRET)
                .header(raftq::raft::network::FORMAT_HEADER, "2")
                .body(vote_body.clone());
            let resp = c.send(request, &url).await;
            if let Err(e) = Cluster::check_problem(resp, 400, "invalid_argument").await {
                failures.push(format!(
                    "node {node} /raft/{endpoint} with body format 2: {e}"
                ));
            }
        }
        let status_url = format!("{base}/raft/status");
        let resp = c
            .send(http.get(&status_url), "GET /raft/status without secret")
            .await;
        if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
            failures.push(format!(
                "node {node} GET /raft/status without the secret: {e}"
            ));
        }
        let resp = c
            .send(
                http.get(&status_url).header(SECRET_HEADER, SECRET),
                "GET /raft/status",
            )
            .await;
        if resp.status() != StatusCode::OK {
            failures.push(format!(
                "node {node} GET /raft/status with the secret: {}",
                resp.status()
            ));
        }
    }
    if !failures.is_empty() {
        c.fail(&format!(
            "Raft endpoint authentication:\n  {}",
            failures.join("\n  ")
        ));
    }

    // Nothing moved: same leader, same term everywhere, and the cluster still takes writes.
    let after = c.wait_leader(Duration::from_secs(10)).await;
    assert_eq!(
        after, leader,
        "the leader changed after refused Raft requests"
    );
    for id in c.running_ids() {
        let status = c.status(id).await.unwrap_or_else(|e| c.fail(&e));
        assert_eq!(
            status.term, term,
            "node {id} changed term after refused Raft requests"
        );
    }
    let ack = c
        .publish_values("r", &["after-raft-garbage".to_string()])
        .await;
    assert_eq!(ack.first_offset, 0);
    c.consistent_log("r").await;
}

/// A snapshot that no leader following the protocol could send (entries of a term beyond the
/// sender's vote) or a broken snapshot file is refused with a 400 to the sender: the node keeps
/// its state and keeps serving, rather than stopping on a broken invariant or a failed install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_no_leader_could_send_are_refused() {
    use openraft::impls::leader_id_adv::LeaderId;
    use raftq::raft::network::SnapshotHeader;
    use raftq::raft::{LogId, SnapshotMeta, Vote};

    let (
        c,
        Roles {
            leader,
            follower,
            term,
        },
    ) = cluster_with_topic("s").await;
    let body = |snapshot_term: u64, file: &[u8]| {
        let header = SnapshotHeader {
            vote: Vote::new_committed(term, leader),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(
                    LeaderId {
                        term: snapshot_term,
                        node_id: leader,
                    },
                    1_000_000,
                )),
                last_membership: Default::default(),
            },
        };
        let mut body = header.frame().expect("encode a snapshot header");
        body.extend_from_slice(file);
        body
    };
    let url = format!("{}/raft/snapshot", c.url(follower));
    for (what, bytes) in [
        (
            "entries beyond the sender's vote",
            body(term + 1, b"RAFTQSNP"),
        ),
        (
            "a file that is not a snapshot",
            body(term, b"not a snapshot at all"),
        ),
    ] {
        let request = c
            .http()
            .post(&url)
            .header(SECRET_HEADER, SECRET)
            .body(bytes);
        let resp = c.send(request, &url).await;
        if let Err(e) = Cluster::check_problem(resp, 400, "invalid_argument").await {
            c.fail(&format!("a snapshot with {what}: {e}"));
        }
    }

    // Nothing moved: the follower still runs, at the same term, and follows the leader.
    let status = c.status(follower).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(status.term, term, "the follower changed term");
    let ack = c.publish_values("s", &["after".to_string()]).await;
    assert_eq!(ack.first_offset, 0);
    c.consistent_log("s").await;
}
