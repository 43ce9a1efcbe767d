//! Subscriptions against fake nodes. The fake subscription keeps real-enough state (a receipt
//! acked or nacked once answers `stale` afterwards) in a watch channel, so tests wait for what
//! they expect to see ("four receipts settled", "three extends") instead of sleeping: a test
//! that does not see it within 10 s fails.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{watch, Notify, Semaphore};

use super::{bind, client, json_reply, no_leader, problem, redirect, Action, Reply, Request};
use crate::api::{
    ErrorCode, Message, PullRequest, ReadFrom, ReceiptStatus, SubscriptionConfig,
    SubscriptionStart, MAX_RECEIPTS,
};
use crate::{Client, Error, Reader, StopReport, Subscriber, SubscriberOptions};

const SUB: &str = "/v1/topics/t/subscriptions/s";

/// What the fake subscription saw and holds.
#[derive(Debug, Default)]
struct SubState {
    /// Scripted pull answers, in order; when none is left, pulls answer no message (after a
    /// short pause, as a long-poll would).
    deliveries: VecDeque<Vec<Message>>,
    /// Bodies of the pulls answered.
    pulls: Vec<Value>,
    /// Receipts answered `acked`.
    acked: Vec<String>,
    /// Ack requests answered (of any outcome).
    ack_requests: usize,
    /// `(receipt, delay_ms)` of receipts answered `released`.
    released: Vec<(String, u64)>,
    /// `(receipt, ack_timeout_ms)` of every receipt extended.
    extended: Vec<(String, Option<u64>)>,
    /// Receipts acked or released: later acks, nacks and extends of them are `stale`.
    settled: HashSet<String>,
    /// The subscription's configured lease length, as `GET` shows it.
    ack_timeout_ms: Option<u64>,
    /// When set, an extend takes effect (and is answered) this long after it arrives, as a
    /// command committed through Raft would.
    extend_delay: Option<Duration>,
    /// The same for nacks.
    nack_delay: Option<Duration>,
    /// `(what, receipt)` in order: `extend>` and `nack>` when a request arrives; `extend`,
    /// `release` and `ack` when its effect is applied.
    events: Vec<(&'static str, String)>,
}

fn message(offset: u64) -> Message {
    Message {
        receipt: format!("r{offset}"),
        offset,
        delivery_count: 1,
        lease_expires_ms: 1_000_000,
        timestamp_ms: 1,
        key: Some(format!("k{offset}")),
        headers: Default::default(),
        value: format!("v{offset}").into(),
    }
}

fn messages(offsets: impl IntoIterator<Item = u64>) -> Vec<Message> {
    offsets.into_iter().map(message).collect()
}

fn receipts_of(request: &Request) -> Vec<String> {
    let body: Value = serde_json::from_slice(&request.body).expect("json body");
    body["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .map(|receipt| receipt.as_str().expect("a string").to_string())
        .collect()
}

fn results(list: Vec<Value>) -> Reply {
    json_reply(200, json!({ "results": list }))
}

/// The fake subscription `s` on topic `t`: answers like the server would, from `state`.
fn answer(state: &Arc<watch::Sender<SubState>>, request: &Request) -> Action {
    let Some(rest) = request.target.strip_prefix(SUB) else {
        return Action::Reply(problem(404, "topic_not_found"));
    };
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    match (request.method.as_str(), rest) {
        ("GET", "") => {
            let ack_timeout_ms = state.borrow().ack_timeout_ms;
            Action::Reply(json_reply(
                200,
                json!({"topic": "t", "name": "s", "cursor": 0, "backlog": 0, "in_flight": 0,
                       "delivered": 0, "acked": 0, "redelivered": 0, "dead_lettered": 0,
                       "expired_leases": 0, "config": {"start": "first",
                       "ack_timeout_ms": ack_timeout_ms}}),
            ))
        }
        ("POST", "/pull") => {
            let mut delivery = None;
            state.send_modify(|s| {
                s.pulls.push(body.clone());
                delivery = s.deliveries.pop_front();
            });
            match delivery {
                Some(batch) => Action::Reply(json_reply(200, json!({ "messages": batch }))),
                None => Action::Delayed(
                    Duration::from_millis(20),
                    json_reply(200, json!({"messages": []})),
                ),
            }
        }
        ("POST", "/ack") => {
            let mut list = Vec::new();
            state.send_modify(|s| {
                s.ack_requests += 1;
                for receipt in receipts_of(request) {
                    s.events.push(("ack", receipt.clone()));
                    let status = if s.settled.insert(receipt.clone()) {
                        s.acked.push(receipt.clone());
                        "acked"
                    } else {
                        "stale"
                    };
                    list.push(json!({"receipt": receipt, "status": status}));
                }
            });
            Action::Reply(results(list))
        }
        ("POST", "/nack") => {
            let delay_ms = body["delay_ms"].as_u64().expect("delay_ms");
            let receipts = receipts_of(request);
            let delay = state.borrow().nack_delay;
            state.send_modify(|s| {
                for receipt in &receipts {
                    s.events.push(("nack>", receipt.clone()));
                }
            });
            let state = state.clone();
            let apply = move || nack(&state, receipts, delay_ms);
            match delay {
                Some(delay) => Action::Deferred(delay, Box::new(apply)),
                None => Action::Reply(apply()),
            }
        }
        ("POST", "/extend") => {
            let ack_timeout_ms = body["ack_timeout_ms"].as_u64();
            let receipts = receipts_of(request);
            let delay = state.borrow().extend_delay;
            state.send_modify(|s| {
                for receipt in &receipts {
                    s.events.push(("extend>", receipt.clone()));
                }
            });
            let state = state.clone();
            let apply = move || extend(&state, receipts, ack_timeout_ms);
            match delay {
                Some(delay) => Action::Deferred(delay, Box::new(apply)),
                None => Action::Reply(apply()),
            }
        }
        _ => Action::Reply(problem(400, "invalid_argument")),
    }
}

/// Applies and answers a nack: `released`, or `stale` for a settled receipt.
fn nack(state: &watch::Sender<SubState>, receipts: Vec<String>, delay_ms: u64) -> Reply {
    let mut list = Vec::new();
    state.send_modify(|s| {
        for receipt in receipts {
            s.events.push(("release", receipt.clone()));
            let status = if s.settled.insert(receipt.clone()) {
                s.released.push((receipt.clone(), delay_ms));
                "released"
            } else {
                "stale"
            };
            list.push(json!({"receipt": receipt, "status": status}));
        }
    });
    results(list)
}

/// Applies and answers an extend: `extended`, or `stale` for a settled receipt.
fn extend(
    state: &watch::Sender<SubState>,
    receipts: Vec<String>,
    ack_timeout_ms: Option<u64>,
) -> Reply {
    let mut list = Vec::new();
    state.send_modify(|s| {
        for receipt in receipts {
            s.events.push(("extend", receipt.clone()));
            s.extended.push((receipt.clone(), ack_timeout_ms));
            list.push(if s.settled.contains(&receipt) {
                json!({"receipt": receipt, "status": "stale"})
            } else {
                json!({"receipt": receipt, "status": "extended", "lease_expires_ms": 2_000_000})
            });
        }
    });
    results(list)
}

/// A fake subscription and the means to watch it.
struct Fake {
    state: Arc<watch::Sender<SubState>>,
}

impl Fake {
    fn new(deliveries: Vec<Vec<Message>>) -> Fake {
        let state = SubState {
            deliveries: deliveries.into(),
            ..SubState::default()
        };
        Fake {
            state: Arc::new(watch::channel(state).0),
        }
    }

    /// Waits until `condition` holds, failing the test after 10 s.
    async fn until(&self, what: &str, condition: impl FnMut(&SubState) -> bool) {
        let mut rx = self.state.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(condition)).await;
        assert!(
            waited.is_ok(),
            "timed out waiting for {what}; state: {:?}",
            *self.state.borrow()
        );
    }

    fn with<T>(&self, read: impl FnOnce(&SubState) -> T) -> T {
        read(&self.state.borrow())
    }
}

/// Options for tests: a short pull wait, explicit lease (so no `GET` first), fast stop.
fn options() -> SubscriberOptions {
    SubscriberOptions::new()
        .wait(Duration::from_millis(50))
        .ack_timeout(Duration::from_secs(30))
        .stop_grace(Duration::from_secs(10))
}

type Run = tokio::task::JoinHandle<Result<StopReport, crate::RunError>>;

/// Stops the subscriber and returns its report, failing the test after 10 s.
async fn stop(handle: &crate::StopHandle, run: Run) -> StopReport {
    handle.stop();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returns after the stop")
        .expect("run does not panic")
        .expect("run ends without error")
}

#[tokio::test]
async fn subscription_calls_send_the_documented_requests() {
    let a = bind()
        .await
        .serve(|index, request| match (index, request.method.as_str()) {
            (0, "PUT") => Action::Reply(json_reply(201, json!({}))),
            (1, "PUT") => Action::Reply(json_reply(200, json!({}))),
            (2, "GET") => Action::Reply(json_reply(
                200,
                json!({"subscriptions": [{"topic": "t", "name": "s", "cursor": 3, "backlog": 1,
                "in_flight": 0, "delivered": 3, "acked": 3, "redelivered": 0,
                "dead_lettered": 0, "expired_leases": 0, "config": {"start": 2}}]}),
            )),
            (3, "POST") => Action::Reply(json_reply(
                200,
                json!({"messages": [serde_json::to_value(message(7)).unwrap()]}),
            )),
            (4..=6, "POST") => {
                let status = ["acked", "dead_lettered", "extended"][index - 4];
                Action::Reply(results(
                    receipts_of(request)
                        .into_iter()
                        .map(|receipt| json!({"receipt": receipt, "status": status}))
                        .collect(),
                ))
            }
            (7, "PUT") => Action::Reply(json_reply(200, json!({"cursor": 42}))),
            (8, "DELETE") => Action::Reply(Reply {
                status: 204,
                headers: vec![],
                body: vec![],
            }),
            _ => Action::Reply(problem(400, "invalid_argument")),
        });
    let client = client(&[&a.url]);
    let config = SubscriptionConfig {
        start: SubscriptionStart::Offset(2),
        ack_timeout_ms: Some(5_000),
        max_deliveries: Some(3),
        dead_letter_topic: Some("t.dlq".into()),
    };

    assert!(client.create_subscription("t", "s", &config).await.unwrap());
    assert!(!client.create_subscription("t", "s", &config).await.unwrap());
    let list = client.list_subscriptions("t").await.unwrap();
    assert_eq!((list.len(), list[0].cursor), (1, 3));
    assert_eq!(list[0].config.start, SubscriptionStart::Offset(2));
    let pull = PullRequest {
        max: Some(5),
        wait_ms: Some(0),
        ack_timeout_ms: Some(60_000),
        consumer: Some("w-1".into()),
    };
    let pulled = client.pull("t", "s", &pull).await.unwrap();
    assert_eq!(pulled.messages, vec![message(7)]);
    let acked = client.ack("t", "s", &["r7"]).await.unwrap();
    assert_eq!(acked[0].status, ReceiptStatus::Acked);
    let nacked = client
        .nack("t", "s", &["r8", "r9"], Duration::from_secs(2), true)
        .await
        .unwrap();
    assert_eq!(nacked.len(), 2);
    assert_eq!(nacked[1].status, ReceiptStatus::DeadLettered);
    let extended = client
        .extend(
            "t",
            "s",
            &[String::from("r10")],
            Some(Duration::from_secs(9)),
        )
        .await
        .unwrap();
    assert_eq!(extended[0].status, ReceiptStatus::Extended);
    assert_eq!(client.set_cursor("t", "s", 42, true).await.unwrap(), 42);
    client.delete_subscription("t", "s").await.unwrap();

    let requests = a.requests();
    let sent = |index: usize| -> (String, String, Value) {
        let request = &requests[index];
        let body = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        (request.method.clone(), request.target.clone(), body)
    };
    assert_eq!(
        sent(0),
        (
            "PUT".into(),
            SUB.into(),
            json!({"start": 2, "ack_timeout_ms": 5000, "max_deliveries": 3,
                   "dead_letter_topic": "t.dlq"})
        )
    );
    assert_eq!(
        sent(2),
        (
            "GET".into(),
            "/v1/topics/t/subscriptions".into(),
            Value::Null
        )
    );
    assert_eq!(
        sent(3),
        (
            "POST".into(),
            format!("{SUB}/pull"),
            json!({"max": 5, "wait_ms": 0, "ack_timeout_ms": 60000, "consumer": "w-1"})
        )
    );
    assert_eq!(
        sent(4),
        (
            "POST".into(),
            format!("{SUB}/ack"),
            json!({"receipts": ["r7"]})
        )
    );
    assert_eq!(
        sent(5),
        (
            "POST".into(),
            format!("{SUB}/nack"),
            json!({"receipts": ["r8", "r9"], "delay_ms": 2000, "dead_letter": true})
        )
    );
    assert_eq!(
        sent(6),
        (
            "POST".into(),
            format!("{SUB}/extend"),
            json!({"receipts": ["r10"], "ack_timeout_ms": 9000})
        )
    );
    assert_eq!(
        sent(7),
        (
            "PUT".into(),
            format!("{SUB}/cursor"),
            json!({"offset": 42, "allow_backward": true})
        )
    );
    assert_eq!(sent(8).0, "DELETE");
    assert_eq!(sent(8).1, SUB);
    assert_eq!(a.count(), 9);
}

#[tokio::test]
async fn pull_long_polls_beyond_the_request_time_out() {
    let a = bind().await.serve(|_, _| {
        Action::Delayed(
            Duration::from_millis(300),
            json_reply(200, json!({"messages": []})),
        )
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(100))
        .build()
        .unwrap();

    let pull = PullRequest {
        wait_ms: Some(500),
        ..PullRequest::default()
    };
    let pulled = client.pull("t", "s", &pull).await.expect("pull");
    assert!(pulled.messages.is_empty());
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn acks_and_pulls_are_resent_after_a_lost_answer() {
    let fake = Fake::new(vec![messages([0])]);
    let state = fake.state.clone();
    // The first pull and the first ack are applied, but their answers are lost.
    let a = bind().await.serve(
        move |index, request| match (index, answer(&state, request)) {
            (0 | 2, _) => Action::Drop,
            (_, action) => action,
        },
    );
    let client = client(&[&a.url]);

    // The first pull's leases are lost with its answer (the server would deliver those records
    // again after the lease); the re-sent pull answers what is available now.
    let pulled = client
        .pull("t", "s", &PullRequest::default())
        .await
        .unwrap();
    assert!(pulled.messages.is_empty());
    assert_eq!(a.count(), 2);
    assert_eq!(fake.with(|s| s.pulls.len()), 2);

    let acked = client.ack("t", "s", &["r0"]).await.unwrap();
    assert_eq!(a.count(), 4, "the ack was sent twice");
    assert_eq!(fake.with(|s| s.acked.clone()), vec!["r0".to_string()]);
    // The re-sent ack finds the receipt acked by the lost first attempt.
    assert_eq!(acked[0].status, ReceiptStatus::Stale);
}

#[tokio::test]
async fn receipt_results_that_do_not_match_are_a_decode_error() {
    let a = bind()
        .await
        .serve(|_, _| Action::Reply(results(vec![json!({"receipt": "r1", "status": "acked"})])));
    let client = client(&[&a.url]);

    let err = client.ack("t", "s", &["r1", "r2"]).await.unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn invalid_subscription_arguments_send_nothing() {
    let a = bind()
        .await
        .serve(|_, _| Action::Reply(problem(500, "internal")));
    let client = client(&[&a.url]);
    let invalid = |result: Result<(), Error>| {
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{result:?}"
        );
    };
    let none: [&str; 0] = [];
    let too_many = vec!["r".to_string(); MAX_RECEIPTS + 1];

    invalid(client.ack("t", "s", &none).await.map(drop));
    invalid(client.ack("t", "s", &too_many).await.map(drop));
    invalid(client.ack("t", "a/b", &["r"]).await.map(drop));
    invalid(
        client
            .nack("t", "s", &["r"], Duration::from_secs(13 * 3600), false)
            .await
            .map(drop),
    );
    invalid(
        client
            .extend("t", "s", &["r"], Some(Duration::ZERO))
            .await
            .map(drop),
    );
    for pull in [
        PullRequest {
            max: Some(0),
            ..Default::default()
        },
        PullRequest {
            max: Some(1001),
            ..Default::default()
        },
        PullRequest {
            wait_ms: Some(30_001),
            ..Default::default()
        },
        PullRequest {
            ack_timeout_ms: Some(0),
            ..Default::default()
        },
    ] {
        invalid(client.pull("t", "s", &pull).await.map(drop));
    }
    let zero_deliveries = SubscriptionConfig {
        max_deliveries: Some(0),
        ..Default::default()
    };
    invalid(
        client
            .create_subscription("t", "s", &zero_deliveries)
            .await
            .map(drop),
    );
    invalid(client.subscription("", "s").await.map(drop));
    invalid(client.set_cursor("t", "s s", 1, false).await.map(drop));
    invalid(client.delete_subscription("t", "").await);
    assert_eq!(a.count(), 0);

    let subscriber =
        |options: SubscriberOptions| Subscriber::new(client.clone(), "t", "s", options).map(drop);
    invalid(subscriber(SubscriberOptions::new().batch(0)));
    invalid(subscriber(SubscriberOptions::new().concurrency(0)));
    invalid(subscriber(
        SubscriberOptions::new().wait(Duration::from_secs(31)),
    ));
    invalid(subscriber(
        SubscriberOptions::new()
            .ack_timeout(Duration::from_secs(1))
            .extend_every(Duration::from_secs(1)),
    ));
    invalid(Subscriber::new(client.clone(), "t", "s?", SubscriberOptions::new()).map(drop));
    invalid(Reader::new(client.clone(), "t", "").map(drop));
}

#[tokio::test]
async fn subscriber_acks_on_ok_and_nacks_on_err() {
    let fake = Fake::new(vec![messages(0..4)]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        options().nack_delay(Duration::from_millis(1500)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let run = tokio::spawn(subscriber.run(move |message: Message| {
        log.lock().unwrap().push(message.offset);
        async move {
            if message.offset.is_multiple_of(2) {
                Ok(())
            } else {
                Err(format!("offset {} is odd", message.offset))
            }
        }
    }));

    fake.until("four settled receipts", |s| s.settled.len() == 4)
        .await;
    let report = stop(&handle, run).await;

    assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2, 3], "in pull order");
    let (mut acked, released) = fake.with(|s| (s.acked.clone(), s.released.clone()));
    acked.sort();
    assert_eq!(acked, vec!["r0", "r2"]);
    let mut released = released;
    released.sort();
    assert_eq!(
        released,
        vec![("r1".to_string(), 1500), ("r3".to_string(), 1500)]
    );
    assert_eq!((report.pulled, report.processed, report.failed), (4, 4, 2));
    assert_eq!((report.acked, report.nacked, report.stale), (2, 2, 0));
    assert!(report.released_on_stop.is_empty());
    assert!(report.unsettled.is_empty());
    // The pull asked for the lease the options name, and for a batch.
    let pull = fake.with(|s| s.pulls[0].clone());
    assert_eq!(
        pull,
        json!({"max": 10, "wait_ms": 50, "ack_timeout_ms": 30000})
    );
}

#[tokio::test]
async fn subscriber_releases_a_panicking_handlers_message() {
    let fake = Fake::new(vec![messages([5])]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(client(&[&a.url]), "t", "s", options()).unwrap();
    let handle = subscriber.stop_handle();
    let run = tokio::spawn(subscriber.run(|message: Message| async move {
        if message.offset == 5 {
            panic!("handler bug");
        }
        Ok::<(), String>(())
    }));

    fake.until("a release", |s| !s.released.is_empty()).await;
    let report = stop(&handle, run).await;
    assert_eq!(fake.with(|s| s.released.clone()), vec![("r5".into(), 0)]);
    assert_eq!((report.processed, report.failed, report.nacked), (1, 1, 1));
}

#[tokio::test]
async fn subscriber_extends_the_lease_while_a_slow_handler_runs() {
    let fake = Fake::new(vec![messages([0, 1])]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        options()
            .ack_timeout(Duration::from_millis(300))
            .extend_every(Duration::from_millis(30)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let run = tokio::spawn(subscriber.run(move |message: Message| {
        let gate = gate.clone();
        async move {
            if message.offset == 0 {
                gate.notified().await;
            }
            Ok::<(), String>(())
        }
    }));

    // The slow handler's lease is extended again and again, as is the lease of the message
    // waiting behind it, both with the subscriber's lease length.
    let count = |s: &SubState, receipt: &str| {
        s.extended
            .iter()
            .filter(|(extended, _)| extended == receipt)
            .count()
    };
    fake.until("three extends of each held message", |s| {
        count(s, "r0") >= 3 && count(s, "r1") >= 3
    })
    .await;
    assert_eq!(fake.with(|s| s.acked.len()), 0, "nothing acked yet");
    assert!(fake.with(|s| s.extended.iter().all(|(_, ms)| *ms == Some(300))));
    release.notify_one();
    fake.until("both acked", |s| s.acked.len() == 2).await;
    let report = stop(&handle, run).await;
    assert_eq!((report.acked, report.lost_leases), (2, 0));
}

#[tokio::test]
async fn subscriber_reports_a_lease_lost_while_its_handler_ran() {
    let fake = Fake::new(vec![messages([0])]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        options()
            .ack_timeout(Duration::from_millis(300))
            .extend_every(Duration::from_millis(30)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let run = tokio::spawn(subscriber.run(move |_| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok::<(), String>(())
        }
    }));

    fake.until("an extend", |s| !s.extended.is_empty()).await;
    // The lease expires and the record goes to someone else: the receipt is stale from now on.
    fake.state.send_modify(|s| {
        s.settled.insert("r0".into());
    });
    let before = fake.with(|s| s.extended.len());
    fake.until("a stale extend", |s| s.extended.len() > before)
        .await;
    release.notify_one();
    fake.until("the ack", |s| s.ack_requests == 1).await;
    let report = stop(&handle, run).await;
    assert_eq!((report.lost_leases, report.stale, report.acked), (1, 1, 0));
}

#[tokio::test]
async fn subscriber_runs_up_to_concurrency_handlers_at_once() {
    let fake = Fake::new(vec![messages(0..3)]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber =
        Subscriber::new(client(&[&a.url]), "t", "s", options().concurrency(3)).unwrap();
    let handle = subscriber.stop_handle();
    // Each handler waits until all three have started: with fewer at once, none would finish.
    let started = Arc::new(Semaphore::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let (s2, r2) = (started.clone(), running.clone());
    let run = tokio::spawn(subscriber.run(move |_| {
        let (started, running) = (s2.clone(), r2.clone());
        async move {
            running.fetch_add(1, Ordering::SeqCst);
            started.add_permits(1);
            let _all = started.acquire_many(3).await.expect("open");
            started.add_permits(3);
            Ok::<(), String>(())
        }
    }));

    fake.until("three acks", |s| s.acked.len() == 3).await;
    let report = stop(&handle, run).await;
    assert_eq!((running.load(Ordering::SeqCst), report.acked), (3, 3));
}

#[tokio::test]
async fn stop_releases_unstarted_messages_and_lets_the_running_handler_finish() {
    let fake = Fake::new(vec![messages(0..4)]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(client(&[&a.url]), "t", "s", options()).unwrap();
    let handle = subscriber.stop_handle();
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let (s2, g2, c2) = (started.clone(), release.clone(), calls.clone());
    let run = tokio::spawn(subscriber.run(move |_| {
        let (started, gate) = (s2.clone(), g2.clone());
        c2.fetch_add(1, Ordering::SeqCst);
        async move {
            started.notify_one();
            gate.notified().await;
            Ok::<(), String>(())
        }
    }));

    started.notified().await;
    handle.stop();
    // The three messages that never started are released at once, while offset 0 still runs.
    fake.until("three releases", |s| s.released.len() == 3)
        .await;
    assert_eq!(fake.with(|s| s.acked.len()), 0);
    release.notify_one();
    let report = stop(&handle, run).await;

    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no handler starts after the stop"
    );
    assert_eq!(fake.with(|s| s.acked.clone()), vec!["r0".to_string()]);
    let mut released = report.released_on_stop.clone();
    released.sort();
    assert_eq!(
        released,
        vec![(1, "r1".into()), (2, "r2".into()), (3, "r3".into())]
    );
    assert!(fake.with(|s| s.released.iter().all(|(_, delay)| *delay == 0)));
    assert_eq!(
        (report.processed, report.acked, report.cancelled),
        (1, 1, 0)
    );
    assert!(report.unsettled.is_empty());
    // No pull after the stop.
    assert_eq!(fake.with(|s| s.pulls.len()), 1);
}

#[tokio::test]
async fn stop_cancels_handlers_after_the_grace_period_and_releases_their_messages() {
    let fake = Fake::new(vec![messages(0..2)]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        options().stop_grace(Duration::from_millis(100)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let started = Arc::new(Notify::new());
    let s2 = started.clone();
    let run = tokio::spawn(subscriber.run(move |_| {
        let started = s2.clone();
        async move {
            started.notify_one();
            std::future::pending::<()>().await;
            Ok::<(), String>(())
        }
    }));

    started.notified().await;
    let report = stop(&handle, run).await;
    let mut released = report.released_on_stop.clone();
    released.sort();
    assert_eq!(released, vec![(0, "r0".into()), (1, "r1".into())]);
    assert_eq!((report.cancelled, report.processed), (1, 0));
    assert_eq!(fake.with(|s| s.released.len()), 2);
}

#[tokio::test]
async fn a_handler_can_stop_after_its_message_and_nothing_else_runs() {
    // As `raftq consume --max 1` does.
    let fake = Fake::new(vec![messages(0..3)]);
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(client(&[&a.url]), "t", "s", options()).unwrap();
    let handle = subscriber.stop_handle();
    let stopper = handle.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let run = tokio::spawn(subscriber.run(move |_| {
        c2.fetch_add(1, Ordering::SeqCst);
        stopper.stop();
        async { Ok::<(), String>(()) }
    }));

    let report = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("stops by itself")
        .unwrap()
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(report.acked, 1);
    assert_eq!(report.released_on_stop.len(), 2);
}

#[tokio::test]
async fn subscriber_survives_no_leader_redirects_and_lost_ack_answers() {
    let fake = Fake::new(vec![messages(0..2)]);
    let (a, b) = (bind().await, bind().await);
    let b_url = b.url.clone();
    let state = fake.state.clone();
    // B leads. Its first acks are applied but answered with a 500 (outcome unknown) for longer
    // than a client call's deadline, so the subscriber itself must retry them.
    let _b = b.serve(move |_, request| {
        let action = answer(&state, request);
        let acks = state.borrow().ack_requests;
        if request.target.ends_with("/ack") && acks <= 12 {
            return Action::Reply(problem(500, "internal"));
        }
        action
    });
    // A, listed first, has no leader for its first 15 requests (several client deadlines),
    // then redirects to B.
    let a = a.serve(move |index, request| {
        if index < 15 {
            Action::Reply(no_leader())
        } else {
            Action::Reply(redirect(&b_url, &request.target, true))
        }
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let subscriber = Subscriber::new(client, "t", "s", options()).unwrap();
    let handle = subscriber.stop_handle();
    let run = tokio::spawn(subscriber.run(|_| async { Ok::<(), String>(()) }));

    fake.until("the acks retried until answered", |s| s.ack_requests > 12)
        .await;
    let report = stop(&handle, run).await;
    assert!(a.count() >= 16, "{}", a.count());
    // The first (lost) ack attempt acked what it carried (offset 0, and 1 if it was handled by
    // then); the attempt that got through answered stale for it. An ack sent later is acked.
    assert_eq!(fake.with(|s| s.acked.len()), 2);
    assert_eq!(report.processed, 2);
    assert!(report.stale >= 1, "{report:?}");
    assert_eq!(report.acked + report.stale, 2, "{report:?}");
    assert!(report.unsettled.is_empty());
}

#[tokio::test]
async fn subscriber_learns_the_lease_from_the_subscription() {
    let fake = Fake::new(vec![]);
    fake.state.send_modify(|s| s.ack_timeout_ms = Some(4_000));
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        SubscriberOptions::new().wait(Duration::from_millis(50)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let run = tokio::spawn(subscriber.run(|_| async { Ok::<(), String>(()) }));

    fake.until("a pull", |s| !s.pulls.is_empty()).await;
    stop(&handle, run).await;
    assert_eq!(fake.with(|s| s.pulls[0]["ack_timeout_ms"].clone()), 4000);
    assert_eq!(a.requests()[0].method, "GET");
}

#[tokio::test]
async fn a_definite_error_ends_the_run_with_a_report() {
    let fake = Fake::new(vec![messages([0])]);
    let state = fake.state.clone();
    // The subscription is deleted after the first pull.
    let a = bind().await.serve(move |_, request| {
        if state.borrow().pulls.is_empty() {
            answer(&state, request)
        } else {
            Action::Reply(problem(404, "subscription_not_found"))
        }
    });
    let subscriber = Subscriber::new(client(&[&a.url]), "t", "s", options()).unwrap();
    let run = subscriber.run(|_| async { Ok::<(), String>(()) });

    let err = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("ends by itself")
        .unwrap_err();
    assert!(err.error.is(ErrorCode::SubscriptionNotFound), "{err:?}");
    assert_eq!(err.report.processed, 1);
    assert_eq!(err.report.unsettled, vec![(0, "r0".to_string())]);

    let missing = bind()
        .await
        .serve(|_, _| Action::Reply(problem(404, "subscription_not_found")));
    let subscriber =
        Subscriber::new(client(&[&missing.url]), "t", "s", SubscriberOptions::new()).unwrap();
    let err = subscriber
        .run(|_| async { Ok::<(), String>(()) })
        .await
        .unwrap_err();
    assert!(err.error.is(ErrorCode::SubscriptionNotFound));
    assert_eq!(missing.count(), 1);
}

#[tokio::test]
async fn reader_passes_next_offset_as_from_and_survives_a_failover() {
    let (a, b) = (bind().await, bind().await);
    let records = |offsets: std::ops::Range<u64>, next: u64| {
        let list: Vec<Value> = offsets
            .map(|offset| json!({"offset": offset, "timestamp_ms": 1, "value": format!("v{offset}")}))
            .collect();
        json_reply(
            200,
            json!({"records": list, "next_offset": next, "high_watermark": next, "skipped": 0}),
        )
    };
    let b = b.serve(move |index, _| match index {
        0 => Action::Reply(records(3..5, 5)),
        _ => Action::Reply(records(5..5, 5)),
    });
    let b_url = b.url.clone();
    // A serves the first read; then it loses leadership: no leader for longer than a client
    // call's deadline, then a redirect (a read that moves the cursor is a write).
    let a = a.serve(move |index, request| match index {
        0 => Action::Reply(records(0..3, 3)),
        1..=12 => Action::Reply(no_leader()),
        _ => Action::Reply(redirect(&b_url, &request.target, true)),
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut reader = Reader::new(client, "t", "s")
        .unwrap()
        .max(100)
        .wait(Duration::from_millis(20));

    let first = reader.next_batch().await.unwrap();
    assert_eq!(first.records.len(), 3);
    assert_eq!(reader.next_offset(), Some(3));
    let second = reader.next_batch().await.unwrap();
    assert_eq!(second.records[0].offset, 3);
    let third = reader.next_batch().await.unwrap();
    assert!(third.records.is_empty());
    reader.commit().await.unwrap();

    let a_targets: Vec<String> = a.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        a_targets[0], "/v1/topics/t/records?subscription=s&max=100&wait_ms=20",
        "the first read starts at the cursor"
    );
    assert!(a_targets.len() >= 14, "{a_targets:?}");
    assert!(a_targets[1..]
        .iter()
        .all(|t| t == "/v1/topics/t/records?from=3&subscription=s&max=100&wait_ms=20"));
    let b_targets: Vec<String> = b.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        b_targets,
        vec![
            "/v1/topics/t/records?from=3&subscription=s&max=100&wait_ms=20",
            "/v1/topics/t/records?from=5&subscription=s&max=100&wait_ms=20",
            "/v1/topics/t/records?from=5&subscription=s&max=1",
        ]
    );
}

#[tokio::test]
async fn topic_reader_starts_where_asked() {
    let a = bind().await.serve(|_, _| {
        Action::Reply(json_reply(
            200,
            json!({"records": [], "next_offset": 9, "high_watermark": 9, "skipped": 0}),
        ))
    });
    let client = client(&[&a.url]);
    let mut reader = Reader::for_topic(client.clone(), "t")
        .unwrap()
        .wait(Duration::ZERO);
    reader.next_batch().await.unwrap();
    reader.next_batch().await.unwrap();
    reader.commit().await.unwrap(); // nothing to commit without a subscription
    let mut last = Reader::for_topic(client, "t")
        .unwrap()
        .start(ReadFrom::Last)
        .wait(Duration::ZERO);
    last.next_batch().await.unwrap();
    let targets: Vec<String> = a.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        vec![
            "/v1/topics/t/records?from=first",
            "/v1/topics/t/records?from=9",
            "/v1/topics/t/records?from=last",
        ]
    );
}

#[tokio::test]
async fn reader_gives_up_after_retry_for() {
    let a = bind().await.serve(|_, _| Action::Reply(no_leader()));
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(200))
        .build()
        .unwrap();
    // No long-poll wait: a call's deadline would include it.
    let mut reader = Reader::for_topic(client, "t")
        .unwrap()
        .wait(Duration::ZERO)
        .retry_for(Duration::from_millis(300));

    let err = reader.next_batch().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(reader.next_offset(), None);
    // More than one client call was made (each gives up after 200 ms).
    assert!(a.count() >= 4, "{}", a.count());
}

/// Runs offsets 0..4 with a handler that blocks on offset 0, so that 1..3 wait in the queue
/// with their leases extended; stops when `stop_when` holds; then lets offset 0 finish.
/// Returns the fake's events and the report.
async fn stop_during_extensions(
    extend_delay: Option<Duration>,
    nack_delay: Option<Duration>,
    stop_when: impl FnMut(&SubState) -> bool,
) -> (Vec<(&'static str, String)>, StopReport) {
    let fake = Fake::new(vec![messages(0..4)]);
    fake.state.send_modify(|s| {
        s.extend_delay = extend_delay;
        s.nack_delay = nack_delay;
    });
    let state = fake.state.clone();
    let a = bind()
        .await
        .serve(move |_, request| answer(&state, request));
    let subscriber = Subscriber::new(
        client(&[&a.url]),
        "t",
        "s",
        options()
            .ack_timeout(Duration::from_millis(300))
            .extend_every(Duration::from_millis(30)),
    )
    .unwrap();
    let handle = subscriber.stop_handle();
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let run = tokio::spawn(subscriber.run(move |message: Message| {
        let gate = gate.clone();
        async move {
            if message.offset == 0 {
                gate.notified().await;
            }
            Ok::<(), String>(())
        }
    }));

    fake.until("the moment to stop", stop_when).await;
    handle.stop();
    fake.until("three releases", |s| s.released.len() == 3)
        .await;
    // Offset 0 still runs, and its lease is still extended meanwhile.
    let before = fake.with(|s| s.extended.len());
    fake.until("more extends", |s| s.extended.len() > before)
        .await;
    release.notify_one();
    let report = stop(&handle, run).await;
    assert_eq!(report.released_on_stop.len(), 3);
    assert_eq!(report.acked, 1);
    (fake.with(|s| s.events.clone()), report)
}

/// True when `later` happens to `receipt` after `first` did, in `events`.
fn after(events: &[(&str, String)], receipt: &str, first: &str, later: &str) -> bool {
    events
        .iter()
        .position(|(what, r)| *what == first && r == receipt)
        .is_some_and(|at| {
            events[at..]
                .iter()
                .any(|(what, r)| *what == later && r == receipt)
        })
}

fn arrivals(s: &SubState, what: &str, receipt: &str) -> usize {
    s.events
        .iter()
        .filter(|(w, r)| *w == what && r == receipt)
        .count()
}

#[tokio::test]
async fn a_release_waits_for_an_extend_in_flight() {
    // The real server lets an extend applied after a release lease the record again. Stop just
    // as an extend carrying the queued messages arrives (it takes effect 20 ms later): their
    // release must not overtake it.
    let (events, _) = stop_during_extensions(Some(Duration::from_millis(20)), None, |s| {
        arrivals(s, "extend>", "r3") >= 2
    })
    .await;
    for receipt in ["r1", "r2", "r3"] {
        assert!(
            !after(&events, receipt, "release", "extend"),
            "{receipt} extended after its release: {events:?}"
        );
    }
}

#[tokio::test]
async fn a_message_being_released_is_not_extended_any_more() {
    // Releases take 200 ms to apply: ticks go on meanwhile, and must leave them out.
    let (events, _) = stop_during_extensions(None, Some(Duration::from_millis(200)), |s| {
        arrivals(s, "extend>", "r3") >= 2
    })
    .await;
    for receipt in ["r1", "r2", "r3"] {
        assert!(
            !after(&events, receipt, "nack>", "extend>"),
            "{receipt} extended while being released: {events:?}"
        );
    }
    // Ticks went on during the release (offset 0, still running, was extended), so the test
    // did look at extension rounds that could have carried the released messages.
    let sent = events
        .iter()
        .position(|(what, r)| *what == "nack>" && r == "r1")
        .expect("release sent");
    let applied = events
        .iter()
        .position(|(what, r)| *what == "release" && r == "r1")
        .expect("release applied");
    assert!(
        events[sent..applied]
            .iter()
            .any(|(what, r)| *what == "extend>" && r == "r0"),
        "{events:?}"
    );
}
