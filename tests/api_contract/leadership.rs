//! Writes and the leader: a follower redirects writes to the leader, and a leader without a
//! quorum refuses them and acknowledges or shows nothing.

use std::time::{Duration, Instant};

use raftq_client::api::{Problem, PublishResponse};
use raftq_client::Client;
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::{records_of, values, OCTET_STREAM};

/// Sends `request` (to a follower) and checks that the answer is a 307 `not_leader` problem
/// whose `Location` header is `location`; returns the problem.
async fn expect_redirect(
    c: &Cluster,
    request: reqwest::RequestBuilder,
    location: &str,
    what: &str,
) -> Problem {
    let resp = c.send(request, what).await;
    let (problem, headers) = c.expect_problem(resp, 307, "not_leader", what).await;
    assert_eq!(
        headers.get(LOCATION).and_then(|v| v.to_str().ok()),
        Some(location),
        "{what}: Location header"
    );
    problem
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_follower_redirect_to_the_leader() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let followers = c.running_except(leader);
    let (f1, f2) = (followers[0], followers[1]);
    let (lurl, furl) = (c.url(leader), c.url(f1));
    let http = c.http();
    c.create_topic("redir").await;
    c.wait_converged("redir").await;

    // A publish on a follower: 307 to the same path and query on the leader.
    let path = "/v1/topics/redir/records?key=order%2017";
    let location = format!("{lurl}{path}");
    let problem = expect_redirect(
        &c,
        http.post(format!("{furl}{path}"))
            .header(CONTENT_TYPE, OCTET_STREAM)
            .body("via-location"),
        &location,
        "publish on a follower",
    )
    .await;
    assert_eq!(problem.leader_id, Some(leader), "{problem:?}");
    assert_eq!(
        problem.leader_url.as_deref(),
        Some(lurl.as_str()),
        "{problem:?}"
    );
    let info = c
        .topic(leader, "redir")
        .await
        .unwrap_or_else(|e| c.fail(&e));
    assert_eq!(
        info.summary.next_offset, 0,
        "a redirected publish must not be applied"
    );

    // Re-sending the request to Location (curl -L style) succeeds.
    let resp = c
        .send(
            http.post(&location)
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body("via-location"),
            "publish re-sent to Location",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "publish re-sent to Location").await;
    assert_eq!(ack.first_offset, 0, "{ack:?}");

    // Topic creation and deletion on a follower redirect too, and are not applied.
    expect_redirect(
        &c,
        http.put(format!("{furl}/v1/topics/redir2"))
            .json(&json!({})),
        &format!("{lurl}/v1/topics/redir2"),
        "PUT on a follower",
    )
    .await;
    expect_redirect(
        &c,
        http.delete(format!("{furl}/v1/topics/redir")),
        &format!("{lurl}/v1/topics/redir"),
        "DELETE on a follower",
    )
    .await;
    let list = c.topics(leader).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["redir"],
        "redirected PUT/DELETE must change nothing: {list:?}"
    );

    // A stock HTTP client that follows redirects (307 keeps method and body) just works.
    let following = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build a redirect-following client");
    let resp = c
        .send(
            following
                .post(format!("{furl}/v1/topics/redir/records"))
                .json(&records_of(&["via-reqwest"])),
            "publish on a follower with a redirect-following client",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "redirect-following client").await;
    assert_eq!(ack.first_offset, 1, "{ack:?}");

    // The SDK given only a follower, then a list that starts with followers.
    let only_follower = c.client_for(std::slice::from_ref(&furl));
    let ack = only_follower
        .publish_records(
            "redir",
            vec![raftq_client::api::RecordIn::text("via-sdk-follower")],
        )
        .await
        .unwrap_or_else(|e| c.fail(&format!("SDK pointed at follower {f1} only: {e}")));
    assert_eq!(ack.first_offset, 2, "{ack:?}");
    assert_eq!(
        only_follower
            .known_leader()
            .map(|u| u.trim_end_matches('/').to_string()),
        Some(lurl.clone()),
        "the SDK should remember the leader it was redirected to"
    );
    let followers_first: Client = c.client_for(&[c.url(f2), furl.clone(), lurl.clone()]);
    let ack = followers_first
        .publish_records(
            "redir",
            vec![raftq_client::api::RecordIn::text("via-sdk-list")],
        )
        .await
        .unwrap_or_else(|e| c.fail(&format!("SDK with followers first: {e}")));
    assert_eq!(ack.first_offset, 3, "{ack:?}");

    // Exactly one copy of each publish, in order, on every node.
    let log = c.consistent_log("redir").await;
    let got: Vec<(Option<&str>, Option<&str>)> = log
        .iter()
        .map(|r| (r.value_str(), r.key.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("via-location"), Some("order 17")),
            (Some("via-reqwest"), None),
            (Some("via-sdk-follower"), None),
            (Some("via-sdk-list"), None),
        ]
    );
}

/// A leader that lost its followers keeps believing it leads (openraft does not step down on
/// its own). Once it has not heard from a quorum for an election timeout, it must refuse
/// writes at once with a definite 503 `no_leader` (not proposed, nothing changes) and report
/// itself not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_without_quorum_refuses_writes_and_is_not_ready() {
    let topic = "lonely";
    let c = Cluster::start_with_values(topic, &["l/0".to_string()]).await;
    let (leader, _) = c.isolate_leader().await;

    let cl = &c;
    c.wait_for(
        "the isolated leader to report itself not ready",
        Duration::from_secs(10),
        move || async move {
            let resp = cl.get_readyz(leader).await?;
            Cluster::check_problem(resp, 503, "no_leader")
                .await
                .map(|_| ())
        },
    )
    .await;

    let resp = c
        .send(
            c.http()
                .post(format!("{}/v1/topics/{topic}/records", c.url(leader)))
                .json(&records_of(&["l/refused"])),
            "publish to a leader without quorum",
        )
        .await;
    c.expect_no_leader(resp, "publish to a leader without quorum")
        .await;
    let info = c.topic(leader, topic).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(
        info.summary.next_offset, 1,
        "a refused write changed the topic: {info:?}"
    );

    // Once the followers are back the write goes through, and the refused value never appears.
    for id in c.ids().into_iter().filter(|id| *id != leader) {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(20)).await;
    c.publish_values(topic, &["l/1".to_string()]).await;
    c.wait_converged(topic).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<Option<&str>> = log.iter().map(|r| r.value_str()).collect();
    assert_eq!(got, vec![Some("l/0"), Some("l/1")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_nothing_is_acknowledged_or_visible() {
    let topic = "quorum";
    let before: Vec<String> = (0..5).map(|i| format!("q/{i}")).collect();
    let c = Cluster::start_with_values(topic, &before).await;

    let (leader, followers) = c.isolate_leader().await;

    // A publish to the isolated leader: it may append the entry but can never commit it.
    let request = c
        .http()
        .post(format!("{}/v1/topics/{topic}/records", c.url(leader)))
        .json(&records_of(&["q/no-quorum"]))
        .timeout(Duration::from_secs(25))
        .send();
    let pending = tokio::spawn(async move {
        let t = Instant::now();
        let answer = match request.await {
            Ok(resp) => {
                let status = resp.status();
                Ok((status, resp.text().await.unwrap_or_default()))
            }
            Err(e) => Err(e.to_string()),
        };
        (answer, t.elapsed())
    });
    // Wait until the entry is in the leader's log beyond its commit index (or until the
    // publish was answered, e.g. because the leader stepped down).
    let cl = &c;
    let pending_ref = &pending;
    c.wait_for(
        "the isolated leader to append the publish",
        Duration::from_secs(10),
        move || async move {
            if pending_ref.is_finished() {
                return Ok(());
            }
            cl.appended_beyond_commit(leader).await
        },
    )
    .await;

    // Reads on the isolated leader never show the uncommitted record, even when waiting.
    let page = c.read(leader, topic, "from=5&wait_ms=1500").await;
    assert!(
        page.records.is_empty(),
        "an uncommitted record was served: {page:?}"
    );
    assert_eq!(page.high_watermark, 5, "{page:?}");
    let page = c.read(leader, topic, "from=first").await;
    assert_eq!(values(&page), before, "{page:?}");
    let info = c.topic(leader, topic).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(info.summary.next_offset, 5, "{info:?}");

    let (answer, elapsed) = pending.await.expect("publish task");
    let definite = match &answer {
        Ok((status, body)) => {
            if status.is_success() {
                c.fail(&format!(
                    "a publish with two of three nodes dead was acknowledged ({status} after \
                     {elapsed:?}): {body}"
                ));
            }
            let code = serde_json::from_str::<Value>(body)
                .ok()
                .map(|v| v["code"].clone());
            status.is_client_error()
                || *status == StatusCode::TEMPORARY_REDIRECT
                || (*status == StatusCode::SERVICE_UNAVAILABLE
                    && matches!(
                        code.as_ref().and_then(Value::as_str),
                        Some("no_leader" | "shutting_down")
                    ))
        }
        Err(_) => false,
    };
    eprintln!(
        "publish without quorum answered after {elapsed:?}: {answer:?} (definite: {definite})"
    );
    // For the report only (not part of the contract): does the isolated leader still claim to
    // lead and to be ready?
    let isolated = c.status(leader).await;
    let ready = c
        .call(reqwest::Method::GET, leader, "/readyz")
        .await
        .status();
    eprintln!(
        "isolated node {leader}: leader_id {:?}, /readyz {ready}",
        isolated.map(|s| s.leader_id)
    );

    // Heal: the log converges, the acknowledged records are there, the refused one at most
    // once (and not at all when the refusal was definite), and writes work again.
    for id in &followers {
        c.restart(*id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    // A write commits only after every entry before it in the leader's log, so once this one
    // is acknowledged the fate of the refused publish is settled too.
    let ack = c.publish_values(topic, &["q/after".to_string()]).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<String> = log
        .iter()
        .filter_map(|r| r.value_str().map(str::to_owned))
        .collect();
    assert_eq!(
        got[..5],
        before[..],
        "the acknowledged records come first: {got:?}"
    );
    let copies = got.iter().filter(|v| *v == "q/no-quorum").count();
    assert!(
        copies <= 1,
        "the unacknowledged publish appears {copies} times"
    );
    assert!(
        !(definite && copies == 1),
        "a publish refused with a definite error ({answer:?}) became visible after healing"
    );
    assert_eq!(got.len(), 5 + copies + 1, "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some("q/after"), "{got:?}");
    assert_eq!(ack.first_offset, (5 + copies) as u64);
}
