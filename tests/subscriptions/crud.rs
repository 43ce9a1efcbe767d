//! Creating, reading and deleting subscriptions, and every refusal of the API.

use std::collections::BTreeSet;
use std::time::Duration;

use raftq_client::api::{ReceiptStatus, SubscriptionInfo};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::http::{
    ack, call_leader, create_sub, next_offsets, offsets, pull, sub_now, sub_path, values,
    wait_sub_everywhere,
};
use crate::SubState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_crud_and_errors() {
    let c = Cluster::start(3).await;
    c.create_topic("t").await;
    c.create_topic("other").await;
    c.publish_values("t", &values(3, "t")).await;
    let s = sub_path("t", "s");

    // PUT: 201, then 200 for the same configuration, 409 for another one.
    let config = json!({"ack_timeout_ms": 60000, "max_deliveries": 5});
    let (_, a) = call_leader(&c, Method::PUT, &s, Some(&config.to_string())).await;
    assert_eq!(a.status, 201, "first PUT of {s}: {}", a.body);
    let (_, a) = call_leader(&c, Method::PUT, &s, Some(&config.to_string())).await;
    assert_eq!(
        a.status, 200,
        "PUT of {s} with the same configuration: {}",
        a.body
    );
    for different in [
        json!({"ack_timeout_ms": 60000}),
        json!({"ack_timeout_ms": 60000, "max_deliveries": 6}),
        json!({"ack_timeout_ms": 60000, "max_deliveries": 5, "dead_letter_topic": "other"}),
    ] {
        let (_, a) = call_leader(&c, Method::PUT, &s, Some(&different.to_string())).await;
        a.expect_problem(&c, 409, "already_exists", &format!("PUT {s} {different}"));
    }

    // GET: a fresh subscription starting at the first record.
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        st,
        SubState {
            cursor: 0,
            backlog: 3,
            in_flight: 0,
            delivered: 0,
            acked: 0,
            redelivered: 0,
            dead_lettered: 0
        },
        "a new subscription on 3 records"
    );
    // The answer also decodes as the SDK's type, with its configuration.
    let leader = c.leader_id().await;
    let info: SubscriptionInfo = c.get_json(leader, &s).await;
    assert_eq!(
        (info.topic.as_str(), info.name.as_str()),
        ("t", "s"),
        "{info:?}"
    );
    assert_eq!(info.config.ack_timeout_ms, Some(60000), "{info:?}");
    assert_eq!(info.config.max_deliveries, Some(5), "{info:?}");

    // Other starts: "next" and an offset.
    create_sub(&c, "t", "from-next", json!({"start": "next"})).await;
    create_sub(&c, "t", "from-2", json!({"start": 2})).await;
    let st = sub_now(&c, "t", "from-next").await;
    assert_eq!((st.cursor, st.backlog), (3, 0), "start next: {st:?}");
    let st = sub_now(&c, "t", "from-2").await;
    assert_eq!((st.cursor, st.backlog), (2, 1), "start 2: {st:?}");

    // The list, and the topic's subscription count, on a follower once replicated.
    c.wait_converged("t").await;
    wait_sub_everywhere(&c, "t", "s", Duration::from_secs(20), |st| {
        if st.backlog == 3 {
            Ok(())
        } else {
            Err("backlog is not 3".into())
        }
    })
    .await;
    let follower = c.follower_id().await;
    let list: Value = c.get_json(follower, "/v1/topics/t/subscriptions").await;
    let names: BTreeSet<&str> = list["subscriptions"]
        .as_array()
        .unwrap_or_else(|| c.fail(&format!("GET /v1/topics/t/subscriptions: {list}")))
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["from-2", "from-next", "s"]),
        "subscription list: {list}"
    );
    let topics = c.topics(follower).await;
    let t = topics
        .topics
        .iter()
        .find(|t| t.name == "t")
        .expect("topic t");
    assert_eq!(t.subscriptions, 3, "{topics:?}");

    // One live delivery whose receipt the refused requests below must not touch.
    let leased = pull(&c, "t", "s", json!({"max": 1})).await;
    assert_eq!(offsets(&leased), vec![0]);
    let receipt = leased[0].receipt.clone();
    let before = sub_now(&c, "t", "s").await;
    assert_eq!(
        (
            before.cursor,
            before.backlog,
            before.in_flight,
            before.delivered
        ),
        (0, 2, 1, 1),
        "after one pull: {before:?}"
    );
    let topics_before = next_offsets(&c).await;
    let leader = c.leader_id().await;
    let list_before: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;

    let r = receipt.as_str();
    let long_name = "a".repeat(129);
    let x = sub_path("t", "x");
    /// What is sent, and the refusal expected: (what, method, path, body, status, code).
    type Refusal = (String, Method, String, Option<String>, u16, &'static str);
    let cases: Vec<Refusal> = vec![
        // Bad subscription configurations.
        (
            "start latest".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": "latest"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "start -1".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": -1}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "start above next_offset".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": 4}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms 0".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms above 12 h".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": 43_200_001u64}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms a string".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": "5"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "max_deliveries 0".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"max_deliveries": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "dead_letter_topic that does not exist".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"dead_letter_topic": "nope"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "dead_letter_topic = the topic itself".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"dead_letter_topic": "t"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "unknown field".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout": 5}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "malformed JSON".into(),
            Method::PUT,
            x.clone(),
            Some("{\"start\":".into()),
            400,
            "invalid_argument",
        ),
        (
            "subscription name with a space".into(),
            Method::PUT,
            sub_path("t", "a%20b"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "subscription name of 129 chars".into(),
            Method::PUT,
            sub_path("t", &long_name),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        // Unknown topic.
        (
            "PUT on an unknown topic".into(),
            Method::PUT,
            sub_path("nope", "s"),
            Some("{}".into()),
            404,
            "topic_not_found",
        ),
        (
            "GET on an unknown topic".into(),
            Method::GET,
            sub_path("nope", "s"),
            None,
            404,
            "topic_not_found",
        ),
        (
            "list on an unknown topic".into(),
            Method::GET,
            "/v1/topics/nope/subscriptions".into(),
            None,
            404,
            "topic_not_found",
        ),
        (
            "pull on an unknown topic".into(),
            Method::POST,
            format!("{}/pull", sub_path("nope", "s")),
            Some("{}".into()),
            404,
            "topic_not_found",
        ),
        (
            "ack on an unknown topic".into(),
            Method::POST,
            format!("{}/ack", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "DELETE on an unknown topic".into(),
            Method::DELETE,
            sub_path("nope", "s"),
            None,
            404,
            "topic_not_found",
        ),
        (
            "nack on an unknown topic".into(),
            Method::POST,
            format!("{}/nack", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "extend on an unknown topic".into(),
            Method::POST,
            format!("{}/extend", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "cursor on an unknown topic".into(),
            Method::PUT,
            format!("{}/cursor", sub_path("nope", "s")),
            Some(json!({"offset": 0}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "read with a subscription on an unknown topic".into(),
            Method::GET,
            "/v1/topics/nope/records?subscription=s".into(),
            None,
            404,
            "topic_not_found",
        ),
        // Unknown subscription.
        (
            "GET of an unknown subscription".into(),
            Method::GET,
            sub_path("t", "nope"),
            None,
            404,
            "subscription_not_found",
        ),
        (
            "pull on an unknown subscription".into(),
            Method::POST,
            format!("{}/pull", sub_path("t", "nope")),
            Some("{}".into()),
            404,
            "subscription_not_found",
        ),
        (
            "ack on an unknown subscription".into(),
            Method::POST,
            format!("{}/ack", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "nack on an unknown subscription".into(),
            Method::POST,
            format!("{}/nack", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "extend on an unknown subscription".into(),
            Method::POST,
            format!("{}/extend", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "cursor of an unknown subscription".into(),
            Method::PUT,
            format!("{}/cursor", sub_path("t", "nope")),
            Some(json!({"offset": 1}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "DELETE of an unknown subscription".into(),
            Method::DELETE,
            sub_path("t", "nope"),
            None,
            404,
            "subscription_not_found",
        ),
        (
            "read with an unknown subscription".into(),
            Method::GET,
            "/v1/topics/t/records?subscription=nope".into(),
            None,
            404,
            "subscription_not_found",
        ),
        // Bad pulls.
        (
            "pull max 0".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"max": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull max 1001".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"max": 1001}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull wait_ms 30001".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"wait_ms": 30001}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull ack_timeout_ms 0".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull with an unknown field".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"maximum": 3}).to_string()),
            400,
            "invalid_argument",
        ),
        // Bad receipts.
        (
            "ack without receipts field".into(),
            Method::POST,
            format!("{s}/ack"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "ack of no receipts".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": []}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a made-up receipt".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": ["not-a-receipt"]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a live receipt plus a made-up one".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [r, "garbage"]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a number".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [42]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack with an unknown field".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [r], "all": true}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of 10,001 receipts".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": vec![r; 10_001]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "nack delay above 12 h".into(),
            Method::POST,
            format!("{s}/nack"),
            Some(json!({"receipts": [r], "delay_ms": 43_200_001u64}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "nack of a made-up receipt".into(),
            Method::POST,
            format!("{s}/nack"),
            Some(json!({"receipts": ["x"], "dead_letter": true}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "extend ack_timeout_ms 0".into(),
            Method::POST,
            format!("{s}/extend"),
            Some(json!({"receipts": [r], "ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        // Bad cursor moves.
        (
            "cursor above next_offset".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some(json!({"offset": 4}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "cursor without offset".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "cursor offset a string".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some(json!({"offset": "2"}).to_string()),
            400,
            "invalid_argument",
        ),
    ];
    let mut failures = Vec::new();
    for (what, method, path, body, status, code) in &cases {
        let (_, a) = call_leader(&c, method.clone(), path, body.as_deref()).await;
        if let Err(e) = a.problem(*status, code) {
            failures.push(format!("{what} ({method} {path}): {e}"));
        }
    }
    // Wrong refusals are reported at the end, after the rest of the test has run.
    let wrong_refusals = (!failures.is_empty()).then(|| {
        let text = format!(
            "{} of {} refusals wrong:\n  {}",
            failures.len(),
            cases.len(),
            failures.join("\n  ")
        );
        eprintln!("{text}");
        text
    });

    // Nothing the refused requests asked for happened.
    let after = sub_now(&c, "t", "s").await;
    assert_eq!(after, before, "refused requests changed the subscription");
    assert_eq!(
        next_offsets(&c).await,
        topics_before,
        "refused requests changed topics"
    );
    let leader = c.leader_id().await;
    let list_after: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;
    assert_eq!(
        list_after, list_before,
        "refused requests changed the subscription list"
    );
    let (_, a) = call_leader(&c, Method::GET, &x, None).await;
    a.expect_problem(
        &c,
        404,
        "subscription_not_found",
        "GET of the never-created x",
    );
    // The receipt named in refused acks/nacks/extends is still the live delivery.
    assert_eq!(
        ack(&c, "t", "s", &[r]).await,
        vec![ReceiptStatus::Acked],
        "the live receipt after the refused requests"
    );
    let st = sub_now(&c, "t", "s").await;
    assert_eq!((st.cursor, st.in_flight, st.acked), (1, 0, 1), "{st:?}");

    // DELETE: 204, then gone; a second DELETE is 404.
    let (_, a) = call_leader(&c, Method::DELETE, &s, None).await;
    assert_eq!(a.status, 204, "DELETE {s}: {}", a.body);
    let (_, a) = call_leader(&c, Method::GET, &s, None).await;
    a.expect_problem(&c, 404, "subscription_not_found", "GET after DELETE");
    let (_, a) = call_leader(&c, Method::DELETE, &s, None).await;
    a.expect_problem(&c, 404, "subscription_not_found", "second DELETE");
    // Re-created, it starts over (no state left behind).
    create_sub(&c, "t", "s", json!({})).await;
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.delivered, st.acked),
        (0, 3, 0, 0, 0),
        "re-created subscription: {st:?}"
    );

    // Deleting the topic deletes its subscriptions; a new topic of that name has none.
    let (_, a) = call_leader(&c, Method::DELETE, "/v1/topics/t", None).await;
    assert_eq!(a.status, 204, "DELETE topic t: {}", a.body);
    let (_, a) = call_leader(&c, Method::GET, &sub_path("t", "from-2"), None).await;
    a.expect_problem(&c, 404, "topic_not_found", "GET sub of a deleted topic");
    c.create_topic("t").await;
    for sub in ["s", "from-2", "from-next"] {
        let (_, a) = call_leader(&c, Method::GET, &sub_path("t", sub), None).await;
        a.expect_problem(
            &c,
            404,
            "subscription_not_found",
            &format!("GET {sub} on the re-created topic t"),
        );
    }
    let leader = c.leader_id().await;
    let list: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;
    assert_eq!(list["subscriptions"], json!([]), "{list}");
    c.wait_converged("t").await;
    for id in c.running_ids() {
        let topics = c.topics(id).await;
        let t = topics
            .topics
            .iter()
            .find(|t| t.name == "t")
            .expect("topic t");
        assert_eq!(t.subscriptions, 0, "node {id}: {topics:?}");
    }
    if let Some(text) = wrong_refusals {
        c.fail(&text);
    }
}
