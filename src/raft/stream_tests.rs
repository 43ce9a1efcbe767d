//! The streamed appends against small servers on a real socket: frames across chunk
//! boundaries, several requests in flight before the first answer, an older peer (404), a
//! peer that takes requests and never answers, and nothing dialled before there is a request.

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use openraft::raft::AppendEntriesRequest;

use super::*;
use crate::raft::{TypeConfig, Vote};

fn request(n: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new(n, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: vec![],
    }
}

/// Serves `router` on a free loopback port: its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

/// Requests `first..first + n` as a stream that stays open (as openraft's does) until dropped.
fn requests(first: u64, n: u64) -> impl futures::Stream<Item = AppendEntriesRequest<TypeConfig>> {
    futures::stream::iter((first..first + n).map(request)).chain(futures::stream::pending())
}

async fn open_to(
    url: &str,
    ttl: Duration,
    input: impl futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + 'static,
) -> Result<Result<BoxStream<'static, Item>, impl Sized>, RPCError<TypeConfig>> {
    let request = reqwest::Client::new().post(format!("{url}/raft/{PATH}"));
    open(request, 2, 1 << 20, ttl, Box::pin(input)).await
}

#[test]
fn frames_are_taken_whole_across_chunks_and_bad_ones_are_refused() {
    // A frame is the body of a single append (format 1) behind its length: the bytes on the
    // wire, pinned.
    let body = codec::encode(&request(1)).expect("encode");
    let mut expected = (body.len() as u32).to_le_bytes().to_vec();
    expected.extend(&body);
    assert_eq!(frame(&request(1)).expect("frame").to_vec(), expected);
    let bytes: Vec<u8> = [request(1), request(2)]
        .iter()
        .flat_map(|r| frame(r).expect("frame").to_vec())
        .collect();
    // Every split of two frames into two chunks gives both, in order, and nothing more.
    for cut in 0..=bytes.len() {
        let mut frames = Frames::new(1 << 20);
        let mut got = Vec::new();
        for chunk in [&bytes[..cut], &bytes[cut..]] {
            frames.push(chunk);
            while let Some(r) = frames
                .take::<AppendEntriesRequest<TypeConfig>>()
                .expect("decodes")
            {
                got.push(r.vote);
            }
        }
        assert_eq!(got, vec![Vote::new(1, 1), Vote::new(2, 1)], "cut at {cut}");
        assert!(frames.is_empty());
    }
    // A length over the limit is refused before its bytes arrive.
    let mut frames = Frames::new(16);
    frames.push(&1000u32.to_le_bytes());
    let err = frames.take::<Answer>().expect_err("over the limit");
    assert!(err.contains("over the limit"), "{err}");
    // Bytes that are not the value are refused.
    let mut frames = Frames::new(1 << 20);
    frames.push(&3u32.to_le_bytes());
    frames.push(&[0xff, 0xff, 0xff]);
    let err = frames.take::<Answer>().expect_err("garbage");
    assert!(err.contains("undecodable"), "{err}");
}

/// The peer answers nothing until it holds three requests: only a sender with several
/// appends in flight gets any answer.
#[tokio::test]
async fn several_appends_are_in_flight_before_the_first_answer() {
    let router = Router::new().route(
        &format!("/raft/{PATH}"),
        post(|body: Body| async move {
            // The head goes back at once (as a node's does); the answers only once three
            // requests are in.
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
            tokio::spawn(async move {
                let mut chunks = body.into_data_stream();
                for answer in answers_after_three(&mut chunks).await {
                    let _ = tx.send(answer).await;
                }
                // Hold the stream open, as a node does while its leader still sends.
                while chunks.next().await.is_some() {}
            });
            let body = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
            });
            (StatusCode::OK, Body::from_stream(body)).into_response()
        }),
    );
    let url = serve(router).await;
    let answers = open_to(&url, Duration::from_secs(5), requests(1, 3))
        .await
        .expect("opens")
        .unwrap_or_else(|_| panic!("the peer takes the stream"));
    let got: Vec<_> = tokio::time::timeout(Duration::from_secs(10), answers.take(3).collect())
        .await
        .expect("three answers, so three requests were in flight at once");
    for answer in got {
        assert!(matches!(answer, Ok(Ok(None))), "{answer:?}");
    }
}

/// Reads frames until three requests are in, then answers each, in order.
async fn answers_after_three(chunks: &mut axum::body::BodyDataStream) -> Vec<Bytes> {
    let mut frames = Frames::new(1 << 20);
    let mut held = 0;
    while held < 3 {
        match frames.take::<AppendEntriesRequest<TypeConfig>>() {
            Ok(Some(_)) => held += 1,
            Ok(None) => match chunks.next().await {
                Some(Ok(chunk)) => frames.push(&chunk),
                _ => return Vec::new(),
            },
            Err(_) => return Vec::new(),
        }
    }
    let answer: Answer = Ok(Ok(None));
    (0..3).map(|_| frame(&answer).expect("frame")).collect()
}

#[tokio::test]
async fn a_peer_without_the_endpoint_gets_the_requests_back_to_send_one_at_a_time() {
    let url = serve(Router::new()).await;
    let opened = open_to(&url, Duration::from_secs(5), requests(1, 1))
        .await
        .expect("an answer");
    assert!(opened.is_err(), "a 404 hands the requests back");
}

#[tokio::test]
async fn a_peer_that_takes_requests_and_never_answers_times_out() {
    let router = Router::new().route(
        &format!("/raft/{PATH}"),
        post(|body: Body| async move {
            // Keep reading the requests (so the sender is not held up), answer nothing.
            tokio::spawn(async move {
                let mut chunks = body.into_data_stream();
                while chunks.next().await.is_some() {}
            });
            (
                StatusCode::OK,
                Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()),
            )
                .into_response()
        }),
    );
    let url = serve(router).await;
    let ttl = Duration::from_millis(200);
    let mut answers = open_to(&url, ttl, requests(1, 1))
        .await
        .expect("opens")
        .unwrap_or_else(|_| panic!("the peer takes the stream"));
    let first = tokio::time::timeout(Duration::from_secs(10), answers.next())
        .await
        .expect("an item well before 10 s");
    match first {
        Some(Err(RPCError::Network(e))) => {
            assert!(e.to_string().contains("did not answer"), "{e}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(answers.next().await.is_none(), "the stream ends after it");
}

/// openraft waits out its backoff after a failed stream inside the stream's first item: the
/// peer is not dialled before that item is there (else a peer that is down would be dialled
/// again at once, in a loop), and a stream that ends empty dials nothing.
#[tokio::test]
async fn nothing_is_dialled_before_the_first_request() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while let Ok((socket, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(socket);
            }
        }
    });
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        open_to(&url, Duration::from_secs(1), futures::stream::pending()),
    )
    .await;
    assert!(waiting.is_err(), "open returned before a request was there");
    let ended = open_to(&url, Duration::from_secs(1), futures::stream::empty())
        .await
        .expect("an empty stream opens");
    let Ok(mut answers) = ended else {
        panic!("an empty stream was handed back");
    };
    assert!(answers.next().await.is_none());
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// A peer that answers each append as it arrives, with success.
fn answering_each() -> Router {
    Router::new().route(
        &format!("/raft/{PATH}"),
        post(|body: Body| async move {
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
            tokio::spawn(async move {
                let mut chunks = body.into_data_stream();
                let mut frames = Frames::new(1 << 20);
                let answer: Answer = Ok(Ok(None));
                while let Some(Ok(chunk)) = chunks.next().await {
                    frames.push(&chunk);
                    while let Ok(Some(_)) = frames.take::<AppendEntriesRequest<TypeConfig>>() {
                        if tx.send(frame(&answer).expect("frame")).await.is_err() {
                            return;
                        }
                    }
                }
            });
            let body = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
            });
            (StatusCode::OK, Body::from_stream(body)).into_response()
        }),
    )
}

fn log_id(index: u64) -> crate::raft::LogId {
    use openraft::vote::RaftLeaderId;
    crate::raft::LogId::new(openraft::impls::leader_id_adv::LeaderId::new(1, 1), index)
}

/// An entry-less append whose previous entry is `prev`.
fn resuming_after(prev: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        prev_log_id: Some(log_id(prev)),
        ..request(1)
    }
}

/// An append whose previous entry is `prev` and that carries entry `first`.
fn carrying(prev: u64, first: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        entries: vec![crate::raft::Entry {
            log_id: log_id(first),
            payload: openraft::EntryPayload::Blank,
        }],
        ..resuming_after(prev)
    }
}

/// What `input` gets on a stream opened with `client`: the answers, in order,
/// until the stream ends or none comes for a while (`None` then).
async fn answers_to(
    client: &mut crate::raft::network::Peer,
    input: Vec<AppendEntriesRequest<TypeConfig>>,
) -> Vec<Option<Item>> {
    use openraft::network::RPCOption;
    use openraft::RaftNetworkV2;
    let n = input.len();
    let input = futures::stream::iter(input).chain(futures::stream::pending());
    let mut answers = client
        .stream_append(Box::pin(input), RPCOption::new(Duration::from_secs(5)))
        .await
        .expect("opens");
    let mut got = Vec::new();
    for _ in 0..n {
        let next = tokio::time::timeout(Duration::from_secs(2), answers.next()).await;
        let ended = !matches!(next, Ok(Some(Ok(_))));
        got.push(next.ok().flatten());
        if ended {
            break;
        }
    }
    got
}

/// A replication stream that has gone on behind the leader's purged log (openraft can leave
/// one running after it has sent the follower a snapshot and purged behind it; it then repeats
/// an entry-less request forever) is ended with an error at its second such request, after the
/// requests before it were sent and answered; one whose entries do not follow its previous
/// entry is ended at once. Heartbeats, which carry the leader's possibly older idea of the
/// follower's log, are never checked.
#[tokio::test]
async fn a_replication_stream_behind_the_purged_log_is_ended() {
    use openraft::network::RaftNetworkFactory;
    use openraft::BasicNode;
    use std::sync::atomic::AtomicU64;

    let url = serve(answering_each()).await;
    // 100 is the last purged entry: a stream may resume after it, not before.
    let mut net = crate::raft::network::Network::new(
        reqwest::Client::new(),
        "secret".into(),
        1 << 20,
        Default::default(),
        Arc::new(AtomicU64::new(101)),
    );
    let node = BasicNode { addr: url };
    let behind = || {
        vec![
            resuming_after(150),
            carrying(100, 101),
            resuming_after(40),
            resuming_after(40),
        ]
    };
    let stale = |answer: &Option<Item>| match answer {
        Some(Err(RPCError::Network(e))) => e.to_string().contains("purged"),
        _ => false,
    };
    let answered = |answer: &Option<Item>| matches!(answer, Some(Ok(Ok(None))));

    let mut replication = net.new_client(2, &node).await;
    let got = answers_to(&mut replication, behind()).await;
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got[..3].iter().all(answered), "{got:?}");
    assert!(
        stale(&got[3]),
        "the second request behind the purged log: {got:?}"
    );

    let got = answers_to(
        &mut replication,
        vec![resuming_after(150), carrying(40, 200)],
    )
    .await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        answered(&got[0]) && stale(&got[1]),
        "entries after a gap: {got:?}"
    );

    let mut heartbeats = net.new_heartbeat_client(2, &node).await;
    let got = answers_to(&mut heartbeats, behind()).await;
    assert!(got.len() == 4 && got.iter().all(answered), "{got:?}");
}
