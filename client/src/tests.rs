//! The client against fake nodes: hand-written HTTP/1.1 servers on tokio sockets whose answers
//! are scripted per request. Every assertion about retries counts the requests a node read,
//! so "sent exactly once" is checked, not assumed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::api::{ErrorCode, PublishRequest, ReadFrom, RecordIn, TopicConfig};
use crate::{Client, Error, ReadOptions};

/// A request as a fake node read it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// Path and query, as sent.
    pub(crate) target: String,
    /// Header names lower-cased.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// What a fake node does with one request it has read in full.
enum Action {
    Reply(Reply),
    /// Answer after a pause (a long-poll).
    Delayed(Duration, Reply),
    /// Answer after a pause, computing the answer (and applying its effect) only then.
    Deferred(Duration, Box<dyn FnOnce() -> Reply + Send>),
    /// Close the connection without answering: the request arrived, the answer is lost.
    Drop,
    /// Never answer.
    Hang,
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

fn json_reply(status: u16, body: serde_json::Value) -> Reply {
    Reply {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
    }
}

fn problem(status: u16, code: &str) -> Reply {
    let mut reply = json_reply(
        status,
        json!({"type": "about:blank", "title": code, "status": status, "detail": "scripted", "code": code}),
    );
    reply.headers = vec![("content-type".into(), "application/problem+json".into())];
    reply
}

fn text_reply(status: u16, text: &str) -> Reply {
    Reply {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: text.as_bytes().to_vec(),
    }
}

fn published(first: u64, last: u64, duplicate: bool) -> Reply {
    json_reply(
        200,
        json!({"first_offset": first, "last_offset": last, "duplicate": duplicate,
               "commit_point": {"index": 7, "timestamp_ms": 1}}),
    )
}

fn redirect(to_base: &str, target: &str, with_leader_url: bool) -> Reply {
    let body = if with_leader_url {
        json!({"type": "about:blank", "title": "Not the leader", "status": 307, "detail": "x",
               "code": "not_leader", "leader_id": 2, "leader_url": to_base})
    } else {
        json!({"type": "about:blank", "title": "Not the leader", "status": 307, "detail": "x",
               "code": "not_leader"})
    };
    json_reply(307, body).with_header("location", &format!("{to_base}{target}"))
}

fn no_leader() -> Reply {
    problem(503, "no_leader").with_header("retry-after", "0")
}

type Handler = Arc<dyn Fn(usize, &Request) -> Action + Send + Sync>;

/// A bound, not yet serving fake node, so that nodes can name each other in redirects.
struct Bound {
    listener: TcpListener,
    url: String,
}

async fn bind() -> Bound {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    Bound { listener, url }
}

/// A URL on which nothing listens: connecting is refused.
async fn dead_url() -> String {
    let bound = bind().await;
    bound.url
}

struct FakeNode {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeNode {
    fn count(&self) -> usize {
        self.requests.lock().expect("lock").len()
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Bound {
    /// Serves `handler`, called with the node-wide index of each request.
    fn serve(
        self,
        handler: impl Fn(usize, &Request) -> Action + Send + Sync + 'static,
    ) -> FakeNode {
        let handler: Handler = Arc::new(handler);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = self.listener.accept().await {
                tokio::spawn(serve_connection(stream, handler.clone(), log.clone()));
            }
        });
        FakeNode {
            url: self.url,
            requests,
        }
    }
}

async fn serve_connection(stream: TcpStream, handler: Handler, log: Arc<Mutex<Vec<Request>>>) {
    let _ = stream.set_nodelay(true);
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    while let Some(request) = read_request(&mut reader).await {
        let index = {
            let mut log = log.lock().expect("lock");
            log.push(request.clone());
            log.len() - 1
        };
        let reply = match handler(index, &request) {
            Action::Reply(reply) => reply,
            Action::Delayed(pause, reply) => {
                tokio::time::sleep(pause).await;
                reply
            }
            Action::Deferred(pause, make) => {
                tokio::time::sleep(pause).await;
                make()
            }
            Action::Drop => return,
            Action::Hang => std::future::pending().await,
        };
        let mut answer = format!("HTTP/1.1 {} Scripted\r\n", reply.status);
        for (name, value) in &reply.headers {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
        answer.push_str(&format!("content-length: {}\r\n\r\n", reply.body.len()));
        // One write: head and body in two segments would meet Nagle and delayed ACKs and
        // slow every exchange to 40 ms.
        let mut answer = answer.into_bytes();
        answer.extend_from_slice(&reply.body);
        if write_half.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// Reads one HTTP/1.1 request (head and `content-length` body); `None` at the end of the
/// connection or on a malformed request.
pub(crate) async fn read_request(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.ok()?;
    Some(Request {
        method,
        target,
        headers,
        body,
    })
}

/// Publishes `records()` through a client of one fake node that answers every request with
/// `reply()`; returns the node (to count what it got) and the error.
async fn publish_error_against(
    reply: impl Fn() -> Reply + Send + Sync + 'static,
) -> (FakeNode, Error) {
    let a = bind().await.serve(move |_, _| Action::Reply(reply()));
    let err = client(&[&a.url])
        .publish_records("t", records())
        .await
        .unwrap_err();
    (a, err)
}

fn client(urls: &[&str]) -> Client {
    Client::builder(urls)
        .deadline(Duration::from_secs(3))
        .request_timeout(Duration::from_secs(2))
        .build()
        .expect("client")
}

fn records() -> Vec<RecordIn> {
    vec![RecordIn::text("one"), RecordIn::text("two").with_key("k")]
}

fn idempotent_batch() -> PublishRequest {
    PublishRequest {
        records: records(),
        producer_id: Some("p-1".into()),
        sequence: Some(4),
    }
}

const RECORDS: &str = "/v1/topics/t/records";

#[tokio::test]
async fn redirect_is_followed_with_body_and_token_and_leader_is_remembered() {
    let (a, b) = (bind().await, bind().await);
    let b_url = b.url.clone();
    let b = b.serve(|index, _| Action::Reply(published(index as u64, index as u64, false)));
    let a = a.serve(move |_, _| Action::Reply(redirect(&b_url, RECORDS, true)));
    let client = Client::builder([&a.url, &b.url])
        .token("tok")
        .build()
        .expect("client");

    let first = client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!(first.first_offset, 0);
    assert_eq!((a.count(), b.count()), (1, 1));
    let (sent, resent) = (&a.requests()[0], &b.requests()[0]);
    assert_eq!(
        sent.body, resent.body,
        "the redirect re-sends the same body"
    );
    assert_eq!(
        (sent.method.as_str(), resent.method.as_str()),
        ("POST", "POST")
    );
    assert_eq!(resent.target, RECORDS);
    for request in [sent, resent] {
        assert_eq!(request.header("authorization"), Some("Bearer tok"));
        assert_eq!(
            request.header("content-type"),
            Some(crate::api::RECORD_BATCH_CONTENT_TYPE)
        );
    }
    assert_eq!(client.known_leader(), Some(format!("{}/", b.url)));

    // The next write and the next read go straight to the remembered leader.
    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!((a.count(), b.count()), (1, 2));
}

#[tokio::test]
async fn redirect_by_location_alone_to_an_unlisted_node_is_learnt() {
    let (a, b) = (bind().await, bind().await);
    let b_url = b.url.clone();
    let b = b.serve(|_, _| Action::Reply(published(3, 4, false)));
    let a = a.serve(move |_, _| Action::Reply(redirect(&b_url, RECORDS, false)));
    let client = client(&[&a.url]);

    client
        .publish_records("t", records())
        .await
        .expect("publish");
    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!((a.count(), b.count()), (1, 2));
    assert_eq!(client.known_leader(), Some(format!("{}/", b.url)));
}

#[tokio::test]
async fn redirect_loop_is_capped_and_ends_unavailable() {
    let a = bind().await;
    let a_url = a.url.clone();
    let a = a.serve(move |_, _| Action::Reply(redirect(&a_url, RECORDS, true)));
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(300))
        .build()
        .expect("client");

    let err = client.publish_records("t", records()).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(err.code(), Some(ErrorCode::NotLeader));
    // Rounds of one attempt plus five hops, each followed by a growing pause (12 ms and up):
    // at most a few rounds fit in 300 ms, where an uncapped loop would make thousands of
    // requests.
    assert!(a.count() >= 6 && a.count() <= 60, "{}", a.count());
}

#[tokio::test]
async fn no_leader_is_retried_until_a_leader_answers() {
    let a = bind().await.serve(|index, _| match index {
        0 | 1 => Action::Reply(no_leader()),
        _ => Action::Reply(published(0, 1, false)),
    });
    let client = client(&[&a.url]);

    // Not idempotent, and still retried: no_leader is a definite "not applied".
    let ack = client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!(ack.last_offset, 1);
    assert_eq!(a.count(), 3);
}

#[tokio::test]
async fn shutting_down_node_hands_over_to_the_leader_it_names() {
    let (a, b) = (bind().await, bind().await);
    let b_url = b.url.clone();
    let b = b.serve(|_, _| Action::Reply(published(0, 1, false)));
    let a = a.serve(move |_, _| {
        let mut reply = json_reply(
            503,
            json!({"type": "about:blank", "title": "Shutting down", "status": 503,
                   "detail": "bye", "code": "shutting_down", "leader_url": b_url}),
        );
        reply.headers.push(("retry-after".into(), "0".into()));
        Action::Reply(reply)
    });
    let client = client(&[&a.url]);

    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!((a.count(), b.count()), (1, 1));
}

#[tokio::test]
async fn overloaded_is_retried_on_the_same_node() {
    let (a, b) = (bind().await, bind().await);
    let b = b.serve(|_, _| Action::Reply(published(0, 1, false)));
    let a = a.serve(|index, _| match index {
        0 => Action::Reply(problem(429, "overloaded").with_header("retry-after", "0")),
        _ => Action::Reply(published(0, 1, false)),
    });
    let client = client(&[&a.url, &b.url]);

    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!((a.count(), b.count()), (2, 0));
}

#[tokio::test]
async fn unsafe_publish_is_not_resent_after_a_dropped_connection() {
    let (a, b) = (bind().await, bind().await);
    let a = a.serve(|_, _| Action::Drop);
    let b = b.serve(|_, _| Action::Reply(published(0, 1, false)));
    let client = client(&[&a.url, &b.url]);

    let err = client.publish_records("t", records()).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert!(err.may_have_been_applied());
    assert_eq!(a.count(), 1, "sent exactly once");
    assert_eq!(b.count(), 0, "not re-sent elsewhere either");
}

#[tokio::test]
async fn unsafe_publish_bytes_is_not_resent_after_a_time_out() {
    let a = bind().await.serve(|_, _| Action::Hang);
    let client = Client::builder([&a.url])
        .deadline(Duration::from_secs(5))
        .request_timeout(Duration::from_millis(200))
        .build()
        .expect("client");

    let err = client
        .publish_bytes("t", None, b"raw".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert_eq!(a.count(), 1);
}

/// A publish goes as one Kafka record batch by default: the records' bytes (a binary value as
/// its bytes, not base64), keys and headers, with `producer_id` and `sequence` in the query;
/// with `PublishFormat::Json`, as the JSON body of API.md.
#[tokio::test]
async fn publishes_go_as_record_batches_by_default_and_as_json_when_asked() {
    let a = bind()
        .await
        .serve(|index, _| Action::Reply(published(index as u64, index as u64, false)));
    let mut request = idempotent_batch();
    request.records.push(
        RecordIn::binary(&[0, 159, 146, 150, 255])
            .with_header("h", "v")
            .with_key("k2"),
    );
    client(&[&a.url])
        .publish("t", &request)
        .await
        .expect("publish");
    Client::builder([&a.url])
        .publish_format(crate::PublishFormat::Json)
        .build()
        .expect("client")
        .publish("t", &request)
        .await
        .expect("publish");

    let requests = a.requests();
    assert_eq!(
        requests[0].header("content-type"),
        Some(crate::api::RECORD_BATCH_CONTENT_TYPE)
    );
    assert_eq!(
        requests[0].target,
        format!("{RECORDS}?producer_id=p-1&sequence=4")
    );
    let limits = crate::batch::Limits::default();
    let batches = crate::batch::decode_all(&requests[0].body, &limits).expect("record batches");
    let sent = &batches[0].records;
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[2].value, Some(&[0u8, 159, 146, 150, 255][..]));
    assert_eq!(sent[2].key, Some(&b"k2"[..]));
    assert_eq!(sent[2].headers[0].key, "h");
    assert_eq!(sent[1].value, Some(&b"two"[..]));
    assert_eq!(sent[0].key, None);
    assert_eq!(
        crate::client::sent_publish(&requests[0].target, &requests[0].body).1,
        request
    );

    assert_eq!(requests[1].header("content-type"), Some("application/json"));
    assert_eq!(requests[1].target, RECORDS);
    let json: PublishRequest = serde_json::from_slice(&requests[1].body).expect("JSON");
    assert_eq!(json, request);
}

/// A server older than record batches refuses them as an unknown content type (its exact
/// answer, below): the client sends the same records again as JSON, and publishes JSON from
/// then on, without asking again.
#[tokio::test]
async fn a_server_that_predates_record_batches_gets_json() {
    let a = bind().await.serve(|index, request| {
        if request.header("content-type") == Some(crate::api::RECORD_BATCH_CONTENT_TYPE) {
            let mut reply = problem(400, "invalid_argument");
            reply.body = json!({"type": "about:blank", "title": "Bad Request", "status": 400,
                "code": "invalid_argument",
                "detail": "unsupported Content-Type \"application/vnd.raftq.record-batch\": \
                           use application/json or application/octet-stream"})
            .to_string()
            .into_bytes();
            Action::Reply(reply)
        } else {
            Action::Reply(published(index as u64, index as u64, false))
        }
    });
    let client = client(&[&a.url]);
    let batch = idempotent_batch();
    // Encoded as a batch before the client learns the server's age, as a producer's batch
    // that is sent again would be.
    let early = client
        .encode_publish(&batch.records, Some("p-1"), Some(4))
        .expect("encode");
    for _ in 0..2 {
        client.publish("t", &batch).await.expect("publish");
    }
    client
        .send_publish("t", &early, &batch.records, Some("p-1"), Some(4))
        .await
        .expect("the early batch, sent after the refusal");
    let types: Vec<Option<String>> = a
        .requests()
        .iter()
        .map(|r| r.header("content-type").map(str::to_string))
        .collect();
    assert_eq!(
        types,
        vec![
            Some(crate::api::RECORD_BATCH_CONTENT_TYPE.to_string()),
            Some("application/json".to_string()),
            Some("application/json".to_string()),
            Some("application/json".to_string()),
        ],
        "refused once, then JSON only"
    );
    let json: PublishRequest = serde_json::from_slice(&a.requests()[1].body).expect("JSON");
    assert_eq!(json, idempotent_batch());
}

#[tokio::test]
async fn idempotent_publish_is_resent_after_a_dropped_connection() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Drop,
        _ => Action::Reply(published(10, 11, true)),
    });
    let client = client(&[&a.url]);

    let ack = client
        .publish("t", &idempotent_batch())
        .await
        .expect("publish");
    assert!(ack.duplicate);
    assert_eq!(a.count(), 2);
    let requests = a.requests();
    assert_eq!(
        requests[0].body, requests[1].body,
        "same producer_id and sequence"
    );
    let (_, sent) = crate::client::sent_publish(&requests[1].target, &requests[1].body);
    assert_eq!(sent, idempotent_batch());
}

#[tokio::test]
async fn idempotent_publish_is_resent_after_a_time_out() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Hang,
        _ => Action::Reply(published(10, 11, true)),
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_secs(5))
        .request_timeout(Duration::from_millis(200))
        .build()
        .expect("client");

    client
        .publish("t", &idempotent_batch())
        .await
        .expect("publish");
    assert_eq!(a.count(), 2);
}

#[tokio::test]
async fn refusal_after_a_possibly_applied_attempt_is_indeterminate() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Drop,
        _ => Action::Reply(problem(404, "topic_not_found")),
    });
    let client = client(&[&a.url]);

    let err = client.delete_topic("t").await.unwrap_err();
    match &err {
        Error::Indeterminate { detail } => assert!(detail.contains("topic_not_found"), "{detail}"),
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    assert_eq!(a.count(), 2);
}

#[tokio::test]
async fn only_producer_id_without_sequence_is_not_idempotent() {
    let a = bind().await.serve(|_, _| Action::Drop);
    let client = client(&[&a.url]);
    let mut batch = idempotent_batch();
    batch.sequence = None;

    let err = client.publish("t", &batch).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn plain_text_500_makes_an_unsafe_write_indeterminate_without_panicking() {
    let (a, err) = publish_error_against(|| text_reply(500, "oops, stack trace")).await;
    match &err {
        Error::Indeterminate { detail } => assert!(detail.contains("oops"), "{detail}"),
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn internal_problem_500_makes_an_unsafe_write_indeterminate() {
    let (a, err) = publish_error_against(|| problem(500, "internal")).await;
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn reads_retry_a_plain_text_500_on_another_node() {
    let (a, b) = (bind().await, bind().await);
    let a = a.serve(|_, _| Action::Reply(text_reply(500, "boom")));
    let b = b.serve(|_, _| {
        Action::Reply(json_reply(
            200,
            json!({"topics": [{"name": "t", "first_offset": 0,
            "next_offset": 2, "records": 2, "bytes": 6, "subscriptions": 0}]}),
        ))
    });
    let client = client(&[&a.url, &b.url]);

    let topics = client.list_topics().await.expect("list");
    assert_eq!(topics[0].name, "t");
    assert_eq!((a.count(), b.count()), (1, 1));
}

#[tokio::test]
async fn deadline_with_only_refusals_is_unavailable() {
    let a = bind().await.serve(|_, _| Action::Reply(no_leader()));
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(300))
        .build()
        .expect("client");

    let err = client.publish_records("t", records()).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(err.code(), Some(ErrorCode::NoLeader));
    assert!(!err.may_have_been_applied());
    let writes = a.count();
    assert!(writes >= 2, "{writes}");

    let err = client.topic("t").await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(a.count() > writes + 1);
}

#[tokio::test]
async fn deadline_after_a_possibly_applied_attempt_is_indeterminate() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Reply(problem(500, "internal")),
        _ => Action::Reply(no_leader()),
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(300))
        .build()
        .expect("client");

    let err = client.publish("t", &idempotent_batch()).await.unwrap_err();
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert!(a.count() >= 2, "retried after the 500");
}

#[tokio::test]
async fn refused_connections_move_on_and_end_unavailable() {
    let dead = dead_url().await;
    let b = bind()
        .await
        .serve(|_, _| Action::Reply(published(0, 1, false)));
    let client = client(&[&dead, &b.url]);
    // Connect refused proves nothing was sent, so even an unsafe write moves on.
    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!(b.count(), 1);

    let client = Client::builder([dead_url().await, dead_url().await])
        .deadline(Duration::from_millis(300))
        .build()
        .expect("client");
    let err = client.publish_records("t", records()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                last_code: None,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn api_errors_are_returned_at_once() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Reply(problem(404, "topic_not_found")),
        1 => Action::Reply(problem(409, "sequence_gap")),
        _ => Action::Reply(text_reply(404, "no route")),
    });
    let client = client(&[&a.url]);

    let err = client.topic("t").await.unwrap_err();
    assert!(err.is(ErrorCode::TopicNotFound), "{err:?}");
    assert_eq!(err.status(), Some(404));
    assert_eq!(a.count(), 1);

    let err = client.publish("t", &idempotent_batch()).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SequenceGap));
    assert!(!err.may_have_been_applied());
    assert_eq!(a.count(), 2);

    let err = client.delete_topic("t").await.unwrap_err();
    let problem = err.problem().expect("a synthesized problem");
    assert_eq!((problem.status, problem.code), (404, ErrorCode::Unknown));
    assert_eq!(problem.detail, "no route");
    assert_eq!(a.count(), 3);
}

#[tokio::test]
async fn success_with_an_unreadable_body_is_a_decode_error() {
    let (a, err) = publish_error_against(|| text_reply(200, "not json")).await;
    assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    assert!(err.may_have_been_applied());
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn invalid_arguments_send_nothing() {
    let a = bind()
        .await
        .serve(|_, _| Action::Reply(published(0, 0, false)));
    let client = client(&[&a.url]);
    let invalid = |result: Result<(), Error>| {
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{result:?}"
        );
    };

    invalid(
        client
            .create_topic("a/b", &TopicConfig::default())
            .await
            .map(drop),
    );
    invalid(client.topic("").await.map(drop));
    invalid(client.delete_topic("a b").await);
    invalid(client.publish_records("t", vec![]).await.map(drop));
    invalid(client.publish_bytes("é", None, vec![1]).await.map(drop));
    let bad_subscription = ReadOptions::new().subscription("s?x=1");
    invalid(client.read("t", &bad_subscription).await.map(drop));
    let too_long = ReadOptions::new().wait(Duration::from_secs(31));
    invalid(client.read("t", &too_long).await.map(drop));
    assert_eq!(a.count(), 0);
}

#[tokio::test]
async fn bad_client_options_are_rejected() {
    let no_urls: [&str; 0] = [];
    assert!(matches!(
        Client::new(no_urls),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::new(["ftp://h:1"]),
        Err(Error::InvalidUrl { .. })
    ));
    assert!(Client::new(["https://h:1"]).is_ok());
    let not_pem = Client::builder(["https://h:1"])
        .ca_cert_pem("not a certificate")
        .build();
    assert!(
        matches!(not_pem, Err(Error::InvalidArgument(_))),
        "{not_pem:?}"
    );
    let missing = Client::builder(["https://h:1"]).ca_file("/nonexistent/ca.pem");
    assert!(matches!(missing, Err(Error::InvalidArgument(_))));
    assert!(matches!(
        Client::new(["h:1"]),
        Err(Error::InvalidUrl { .. })
    ));
    let bad_token = Client::builder(["http://h:1"]).token("a\nb").build();
    assert!(matches!(bad_token, Err(Error::InvalidArgument(_))));
    let debug = format!("{:?}", Client::builder(["http://h:1"]).token("s3cret"));
    assert!(!debug.contains("s3cret"), "{debug}");
    let client = Client::builder(["http://h:1"])
        .token("s3cret")
        .build()
        .expect("client");
    assert!(!format!("{client:?}").contains("s3cret"));
}

#[tokio::test]
async fn long_poll_read_encodes_its_query_and_outlives_the_request_timeout() {
    let a = bind().await.serve(|_, _| {
        Action::Delayed(
            Duration::from_millis(300),
            json_reply(
                200,
                json!({"records": [{"offset": 5, "timestamp_ms": 1, "value": "v"}],
                                   "next_offset": 6, "high_watermark": 6, "skipped": 0}),
            ),
        )
    });
    let client = Client::builder([&a.url])
        .deadline(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(100))
        .build()
        .expect("client");

    let options = ReadOptions::new()
        .from(ReadFrom::First)
        .subscription("s-1")
        .max(10)
        .max_bytes(100)
        .wait(Duration::from_millis(500));
    let read = client.read("t", &options).await.expect("read");
    assert_eq!(read.records[0].value_bytes(), b"v");
    assert_eq!(a.count(), 1);
    assert_eq!(
        a.requests()[0].target,
        "/v1/topics/t/records?from=first&subscription=s-1&max=10&max_bytes=100&wait_ms=500"
    );
}

#[tokio::test]
async fn publish_bytes_sends_the_raw_body_and_an_encoded_key() {
    let a = bind()
        .await
        .serve(|_, _| Action::Reply(published(0, 0, false)));
    let client = client(&[&a.url]);

    let value = vec![0u8, 159, 146, 150];
    client
        .publish_bytes("t", Some("a b&c=é+"), value.clone())
        .await
        .expect("publish");
    let request = &a.requests()[0];
    assert_eq!(
        request.target,
        "/v1/topics/t/records?key=a%20b%26c%3D%C3%A9%2B"
    );
    assert_eq!(
        request.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(request.body, value);
}

#[tokio::test]
async fn topic_create_and_delete_report_their_statuses() {
    let a = bind()
        .await
        .serve(|index, request| match (index, request.method.as_str()) {
            (0, "PUT") => Action::Reply(json_reply(201, json!({}))),
            (1, "PUT") => Action::Reply(json_reply(200, json!({}))),
            (2, "DELETE") => Action::Reply(Reply {
                status: 204,
                headers: vec![],
                body: vec![],
            }),
            _ => Action::Reply(problem(400, "invalid_argument")),
        });
    let client = client(&[&a.url]);
    let config = TopicConfig {
        max_record_bytes: Some(1024),
        ..TopicConfig::default()
    };

    assert!(client.create_topic("t", &config).await.expect("create"));
    assert!(!client.create_topic("t", &config).await.expect("exists"));
    client.delete_topic("t").await.expect("delete");
    let requests = a.requests();
    assert_eq!(requests[0].target, "/v1/topics/t");
    let sent: TopicConfig = serde_json::from_slice(&requests[0].body).expect("json");
    assert_eq!(sent, config);
}

#[tokio::test]
async fn create_topic_is_resent_after_a_dropped_connection() {
    let a = bind().await.serve(|index, _| match index {
        0 => Action::Drop,
        _ => Action::Reply(json_reply(200, json!({}))),
    });
    let client = client(&[&a.url]);

    assert!(!client
        .create_topic("t", &TopicConfig::default())
        .await
        .expect("create"));
    assert_eq!(a.count(), 2);
}

#[tokio::test]
async fn cluster_status_teaches_the_leader_for_the_next_write() {
    let (a, b) = (bind().await, bind().await);
    let b_url = b.url.clone();
    let b = b.serve(|_, _| Action::Reply(published(0, 1, false)));
    let a = a.serve(move |_, _| {
        Action::Reply(json_reply(
            200,
            json!({"node_id": 1, "leader_id": 2, "leader_url": b_url,
            "term": 3, "commit_index": 9, "last_applied": 9, "snapshot": null,
            "members": [{"id": 1, "url": "x", "voter": true, "matched_index": null}]}),
        ))
    });
    let client = client(&[&a.url]);

    let status = client.cluster().await.expect("cluster");
    assert_eq!(status.leader_id, Some(2));
    client
        .publish_records("t", records())
        .await
        .expect("publish");
    assert_eq!((a.count(), b.count()), (1, 1));
}

/// Subscriptions: the client calls, [`crate::Subscriber`] and [`crate::Reader`].
mod subscriptions;
