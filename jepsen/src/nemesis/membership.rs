//! Membership faults, done through the cluster's own API (leader only; a follower's `307` is
//! followed to the leader): `POST /v1/cluster/voters` sets the complete set of voters (a voter
//! left out stays a learner), `POST /v1/cluster/transfer-leader` moves leadership.
//!
//! Setting the voters is idempotent (asking for the voters there already are changes nothing),
//! so every attempt is checked against the leader's own view of the membership and repeated
//! until that view is the one asked for or the bound passes: an attempt with an unknown outcome
//! (a timeout), another change still in progress (`409`) and no leader (`503`) are retried; a
//! refusal that cannot change by itself (another `4xx`) is not. Node removal
//! (`DELETE /v1/cluster/nodes/{id}`) is never used: a removed id can never join again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom as _;
use serde::Serialize;
use serde_json::json;

use raftq_client::api::{ClusterStatus, TransferLeaderResponse};

use super::say;
use crate::history::History;
use crate::workload::http::{Answer, Class, Http};

/// Timeout of one `GET /v1/cluster`.
const STATUS_TIMEOUT: Duration = Duration::from_millis(1000);
/// Timeout of one `POST /v1/cluster/voters`. Long: a new voter is first let catch up, and a
/// request given up on mid-change leaves its outcome unknown.
const VOTERS_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one `POST /v1/cluster/transfer-leader`: longer than the server's own bound on a
/// hand-over (10 s), so that a transfer is never abandoned half-way by the client.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two attempts at a membership change.
const RETRY_PAUSE: Duration = Duration::from_millis(300);
/// Pause between two leadership transfers, in milliseconds (uniformly drawn).
pub const TRANSFER_EVERY_MS: std::ops::RangeInclusive<u64> = 1000..=2000;
/// A transfer is only started when at least this much of the fault window is left.
const TRANSFER_MIN_LEFT: Duration = Duration::from_millis(1000);

/// Every answering node's `GET /v1/cluster`, asked concurrently.
pub async fn statuses(http: &Http) -> BTreeMap<u64, ClusterStatus> {
    let asks = http.ids().into_iter().map(|id| async move {
        let status: Option<ClusterStatus> = http.get_json(id, "/v1/cluster", STATUS_TIMEOUT).await;
        status.map(|s| (id, s))
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The status of the node that says it leads, with the highest term (a deposed leader that
/// has not heard of the new term yet may still say it leads). `None` when no node does.
pub fn leader_status(statuses: &BTreeMap<u64, ClusterStatus>) -> Option<&ClusterStatus> {
    statuses
        .values()
        .filter(|s| s.leader_id == Some(s.node_id))
        .max_by_key(|s| s.term)
}

/// The voters of a status, lowest first.
pub fn voters_of(status: &ClusterStatus) -> Vec<u64> {
    let mut voters: Vec<u64> = status
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.id)
        .collect();
    voters.sort_unstable();
    voters.dedup();
    voters
}

/// The voters once `node` is demoted: every node of `ids` but it, lowest first.
pub fn without(ids: &[u64], node: u64) -> Vec<u64> {
    let mut rest: Vec<u64> = ids.iter().copied().filter(|id| *id != node).collect();
    rest.sort_unstable();
    rest.dedup();
    rest
}

/// A random voter other than `leader` to hand leadership to; `None` when there is none.
pub fn transfer_target(voters: &[u64], leader: u64, rng: &mut impl rand::Rng) -> Option<u64> {
    let others: Vec<u64> = voters.iter().copied().filter(|v| *v != leader).collect();
    others.choose(rng).copied()
}

/// The nodes of `voters` that the leader lists as voters now (`current`; all of `voters` when
/// the leader lists none): only a voter can take over.
pub fn eligible(voters: &[u64], current: &[u64]) -> Vec<u64> {
    voters
        .iter()
        .copied()
        .filter(|v| current.is_empty() || current.contains(v))
        .collect()
}

/// Whether a membership request that did not succeed is worth repeating: its outcome is
/// unknown, it never reached a node, no leader was known (`503`, or a redirect left
/// unfollowed), another change was in progress (`409`), or the node was busy (`429`). Any
/// other refusal (`4xx`) says the request itself is wrong.
pub fn retryable(answer: &Answer) -> bool {
    match answer.class {
        Class::Ok => false,
        Class::Info => true,
        Class::Fail => match answer.status {
            None => true,
            Some(status) => matches!(status, 307 | 409 | 429) || status >= 500,
        },
    }
}

/// A short text for a failed answer: the status and problem code, or the transport error.
fn explain(answer: &Answer) -> String {
    let mut text = answer
        .error
        .clone()
        .unwrap_or_else(|| format!("status {:?}", answer.status));
    if let Some(detail) = answer.body.get("detail").and_then(|d| d.as_str()) {
        text.push_str(": ");
        text.push_str(detail);
    }
    format!("{text} (from node {})", answer.node)
}

/// What [`ensure_voters`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// The voters the leader listed before the change, lowest first.
    pub before: Vec<u64>,
    /// True when a change was asked for (false: the voters already were the ones wanted).
    pub changed: bool,
    /// The leader that confirmed the voters.
    pub leader: u64,
}

/// Makes `want` the complete set of voters: asks the leader for its membership and, while it
/// differs, sets it, until the leader lists exactly `want` or `deadline` passes (then the last
/// problem is the error).
pub async fn ensure_voters(
    http: &Http,
    want: &[u64],
    deadline: Instant,
) -> anyhow::Result<Ensured> {
    let mut want = want.to_vec();
    want.sort_unstable();
    want.dedup();
    if want.is_empty() {
        anyhow::bail!("refusing to set an empty set of voters");
    }
    let mut before = None;
    let mut changed = false;
    loop {
        let all = statuses(http).await;
        let problem = match leader_status(&all) {
            Some(status) => {
                let voters = voters_of(status);
                let leader = status.node_id;
                before.get_or_insert_with(|| voters.clone());
                if voters == want {
                    return Ok(Ensured {
                        before: before.unwrap_or_default(),
                        changed,
                        leader,
                    });
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let timeout = VOTERS_TIMEOUT.min(left).max(Duration::from_secs(1));
                let body = json!({ "ids": want });
                let answer = http
                    .post(leader, "/v1/cluster/voters", &body, timeout)
                    .await;
                if answer.class == Class::Ok {
                    // Checked against the leader's view on the next round.
                    changed = true;
                    format!(
                        "node {} accepted voters {want:?}, but the leader lists {voters:?}",
                        answer.node
                    )
                } else if retryable(&answer) {
                    // An unknown outcome may still have changed the membership.
                    changed |= answer.class == Class::Info;
                    explain(&answer)
                } else {
                    anyhow::bail!(
                        "setting the voters to {want:?} was refused: {}",
                        explain(&answer)
                    );
                }
            }
            None if all.is_empty() => "no node answered GET /v1/cluster".to_string(),
            None => "no node says it leads".to_string(),
        };
        if Instant::now() >= deadline {
            anyhow::bail!("the voters are not {want:?} in time; last: {problem}");
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// One leadership transfer as the nemesis did it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Move {
    /// Milliseconds since the history's start, when it was asked for.
    pub at_ms: u64,
    /// The leader asked to hand over.
    pub from: u64,
    /// The voter asked to take over.
    pub to: u64,
    /// How long the request took.
    pub millis: u64,
    /// The leader the answer named, when the transfer succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// Why it did not succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Move {
    /// `1->2 ok 640ms`, or `1->2 failed: 503 no_leader (from node 1)`.
    pub fn describe(&self) -> String {
        match (&self.error, self.leader) {
            (None, Some(leader)) if leader == self.to => {
                format!("{}->{} ok {}ms", self.from, self.to, self.millis)
            }
            (None, leader) => format!(
                "{}->{} ok {}ms (leader {})",
                self.from,
                self.to,
                self.millis,
                super::show(leader)
            ),
            (Some(error), _) => format!("{}->{} failed: {error}", self.from, self.to),
        }
    }
}

/// Until `end`, moves leadership to a random other voter of `voters`, again 1–2 s after each
/// transfer: each time the current leader is found and asked to hand over to a voter it lists.
/// A transfer is only started while at least a second is left, and is waited for to the end.
pub async fn transfers(
    http: &Http,
    history: &History,
    voters: &[u64],
    end: Instant,
    rng: &mut impl rand::Rng,
) -> Vec<Move> {
    let mut moves = Vec::new();
    while Instant::now() + TRANSFER_MIN_LEFT <= end {
        let all = statuses(http).await;
        let leader = leader_status(&all).map(|s| (s.node_id, voters_of(s)));
        let Some((from, current)) = leader else {
            say(history, "transfer-leader: no leader known; waiting");
            tokio::time::sleep(RETRY_PAUSE.min(end.saturating_duration_since(Instant::now())))
                .await;
            continue;
        };
        if let Some(to) = transfer_target(&eligible(voters, &current), from, rng) {
            let at_ms = history.elapsed_us() / 1000;
            let started = Instant::now();
            let body = json!({ "to": to });
            let answer = http
                .post(from, "/v1/cluster/transfer-leader", &body, TRANSFER_TIMEOUT)
                .await;
            let millis = started.elapsed().as_millis() as u64;
            let mv = match answer.decode::<TransferLeaderResponse>() {
                Some(r) => Move {
                    at_ms,
                    from,
                    to,
                    millis,
                    leader: Some(r.leader_id),
                    error: None,
                },
                None => Move {
                    at_ms,
                    from,
                    to,
                    millis,
                    leader: None,
                    error: Some(if answer.class == Class::Ok {
                        format!("2xx with an unexpected body: {}", answer.body)
                    } else {
                        explain(&answer)
                    }),
                },
            };
            say(history, &format!("transfer-leader {}", mv.describe()));
            moves.push(mv);
        }
        let pause = Duration::from_millis(rng.gen_range(TRANSFER_EVERY_MS));
        tokio::time::sleep(pause.min(end.saturating_duration_since(Instant::now()))).await;
    }
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftq_client::api::ClusterMember;
    use rand::SeedableRng as _;
    use serde_json::Value;

    fn status(node: u64, leader: Option<u64>, term: u64, voters: &[u64]) -> ClusterStatus {
        ClusterStatus {
            node_id: node,
            leader_id: leader,
            leader_url: None,
            term,
            commit_index: 0,
            last_applied: 0,
            members: (1..=3)
                .map(|id| ClusterMember {
                    id,
                    url: format!("http://n{id}"),
                    voter: voters.contains(&id),
                    matched_index: None,
                })
                .collect(),
            snapshot: None,
            state_digest: None,
        }
    }

    fn answer(class: Class, status: Option<u16>) -> Answer {
        Answer {
            class,
            node: 1,
            status,
            body: Value::Null,
            error: None,
            leader_hint: None,
        }
    }

    #[test]
    fn the_leader_is_the_node_that_says_so_with_the_highest_term() {
        let mut all = BTreeMap::new();
        all.insert(1, status(1, Some(1), 3, &[1, 2, 3]));
        all.insert(2, status(2, Some(2), 4, &[1, 2]));
        all.insert(3, status(3, Some(2), 4, &[1, 2]));
        let leader = leader_status(&all).map(|s| s.node_id);
        assert_eq!(leader, Some(2), "the deposed leader of term 3 is not it");
        all.remove(&2);
        // Node 3 names node 2, but only a node's own word makes it the leader.
        assert_eq!(leader_status(&all).map(|s| s.node_id), Some(1));
        all.clear();
        all.insert(3, status(3, None, 5, &[1, 2, 3]));
        assert!(leader_status(&all).is_none());
    }

    #[test]
    fn voter_sets() {
        assert_eq!(voters_of(&status(1, Some(1), 1, &[3, 1])), vec![1, 3]);
        assert_eq!(voters_of(&status(1, Some(1), 1, &[])), Vec::<u64>::new());
        assert_eq!(without(&[1, 2, 3], 2), vec![1, 3]);
        assert_eq!(without(&[3, 2, 1], 1), vec![2, 3]);
        assert_eq!(without(&[1, 2, 3], 9), vec![1, 2, 3]);
    }

    #[test]
    fn transfers_go_to_another_voter() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let to = transfer_target(&[1, 2, 3], 2, &mut rng);
            assert!(matches!(to, Some(1 | 3)), "{to:?}");
            seen.extend(to);
        }
        assert_eq!(seen.len(), 2, "both other voters get their turn");
        assert_eq!(transfer_target(&[2], 2, &mut rng), None);
        assert_eq!(transfer_target(&[], 2, &mut rng), None);
        // The leader need not be a voter of the list.
        assert_eq!(transfer_target(&[3], 1, &mut rng), Some(3));
        // Only the current voters are eligible.
        assert_eq!(eligible(&[1, 2, 3], &[1, 2]), vec![1, 2]);
        assert_eq!(eligible(&[1, 2, 3], &[]), vec![1, 2, 3]);
        assert_eq!(eligible(&[1, 2], &[2, 3]), vec![2]);
    }

    #[test]
    fn what_is_retried() {
        assert!(retryable(&answer(Class::Info, None)), "unknown outcome");
        assert!(
            retryable(&answer(Class::Fail, None)),
            "never reached a node"
        );
        assert!(
            retryable(&answer(Class::Fail, Some(409))),
            "change in progress"
        );
        assert!(retryable(&answer(Class::Fail, Some(503))), "no leader");
        assert!(retryable(&answer(Class::Fail, Some(307))), "redirect left");
        assert!(
            retryable(&answer(Class::Info, Some(504))),
            "catch-up timeout"
        );
        assert!(
            !retryable(&answer(Class::Fail, Some(400))),
            "a wrong request"
        );
        assert!(!retryable(&answer(Class::Fail, Some(404))));
        assert!(!retryable(&answer(Class::Ok, Some(200))));
    }

    /// A fake cluster of three nodes on the loopback: `GET /v1/cluster` on any node, and
    /// `POST /v1/cluster/voters` and `/v1/cluster/transfer-leader` on the leader (the others
    /// redirect), as the server does them.
    #[derive(Debug, Default)]
    struct Fake {
        /// 0: no leader.
        leader: u64,
        voters: Vec<u64>,
        /// Answer this many voter changes with 409 first.
        busy: usize,
        /// Refuse voter changes with 400.
        refuse: bool,
        posts: usize,
    }

    type Shared = std::sync::Arc<std::sync::Mutex<Fake>>;

    fn fake_status(fake: &Fake, node: u64, urls: &BTreeMap<u64, String>) -> Value {
        json!({
            "node_id": node,
            "leader_id": (fake.leader != 0).then_some(fake.leader),
            "leader_url": urls.get(&fake.leader),
            "term": 1, "commit_index": 0, "last_applied": 0, "snapshot": null,
            "members": urls.iter().map(|(id, url)| json!({
                "id": id, "url": url, "voter": fake.voters.contains(id), "matched_index": null
            })).collect::<Vec<_>>(),
        })
    }

    /// One answer of node `node`: status line, extra headers, body.
    fn fake_answer(
        shared: &Shared,
        node: u64,
        urls: &BTreeMap<u64, String>,
        method: &str,
        path: &str,
        body: &Value,
    ) -> (u16, String, Value) {
        let mut fake = shared.lock().unwrap_or_else(|e| e.into_inner());
        if method == "GET" && path == "/v1/cluster" {
            return (200, String::new(), fake_status(&fake, node, urls));
        }
        if fake.leader != node {
            return match urls.get(&fake.leader) {
                Some(url) => (307, format!("location: {url}{path}\r\n"), json!({})),
                None => (503, String::new(), json!({"code": "no_leader"})),
            };
        }
        match path {
            "/v1/cluster/voters" => {
                fake.posts += 1;
                if fake.refuse {
                    return (400, String::new(), json!({"code": "invalid_argument"}));
                }
                if fake.busy > 0 {
                    fake.busy -= 1;
                    return (409, String::new(), json!({"code": "invalid_argument"}));
                }
                let ids = body["ids"].as_array().cloned().unwrap_or_default();
                fake.voters = ids.iter().filter_map(Value::as_u64).collect();
                (200, String::new(), fake_status(&fake, node, urls))
            }
            "/v1/cluster/transfer-leader" => {
                let to = body["to"].as_u64().unwrap_or(0);
                fake.leader = to;
                (200, String::new(), json!({ "leader_id": to }))
            }
            _ => (404, String::new(), json!({"code": "not_found"})),
        }
    }

    async fn serve_one(
        mut stream: tokio::net::TcpStream,
        shared: Shared,
        node: u64,
        urls: BTreeMap<u64, String>,
    ) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head, rest) = loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..at]).to_string();
                break (head, buf[at + 4..].to_vec());
            }
        };
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            })
            .unwrap_or(0);
        let mut body = rest;
        while body.len() < length {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        let mut words = head.split_whitespace();
        let method = words.next().unwrap_or("").to_string();
        let path = words.next().unwrap_or("").to_string();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (status, headers, out) = fake_answer(&shared, node, &urls, &method, &path, &body);
        let out = out.to_string();
        let text = format!(
            "HTTP/1.1 {status} X\r\n{headers}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
            out.len()
        );
        stream.write_all(text.as_bytes()).await?;
        stream.shutdown().await
    }

    /// Starts the fake cluster; returns a client for it and its state.
    async fn fake_cluster(fake: Fake) -> (Http, Shared) {
        let shared: Shared = std::sync::Arc::new(std::sync::Mutex::new(fake));
        let mut listeners = Vec::new();
        let mut urls = BTreeMap::new();
        for id in 1..=3u64 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let addr = listener.local_addr().expect("a bound address");
            urls.insert(id, format!("http://{addr}"));
            listeners.push((id, listener));
        }
        for (id, listener) in listeners {
            let (shared, urls) = (shared.clone(), urls.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve_one(stream, shared.clone(), id, urls.clone()));
                }
            });
        }
        (Http::new(urls).expect("a client"), shared)
    }

    fn state(shared: &Shared) -> (u64, Vec<u64>, usize) {
        let fake = shared.lock().unwrap_or_else(|e| e.into_inner());
        (fake.leader, fake.voters.clone(), fake.posts)
    }

    #[tokio::test]
    async fn voters_are_set_through_the_leader_retrying_a_busy_one() {
        let (http, shared) = fake_cluster(Fake {
            leader: 2,
            voters: vec![1, 2],
            busy: 2,
            ..Fake::default()
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let ensured = ensure_voters(&http, &[3, 1, 2], deadline).await;
        assert_eq!(
            ensured.ok(),
            Some(Ensured {
                before: vec![1, 2],
                changed: true,
                leader: 2
            })
        );
        // Two answers 409, then the change.
        assert_eq!(state(&shared), (2, vec![1, 2, 3], 3));
        // Already so: nothing is asked.
        let ensured = ensure_voters(&http, &[1, 2, 3], deadline).await;
        assert!(ensured.is_ok_and(|e| !e.changed));
        assert_eq!(state(&shared).2, 3);
        // A demotion.
        let ensured = ensure_voters(&http, &without(&[1, 2, 3], 3), deadline).await;
        assert!(ensured.is_ok_and(|e| e.changed && e.before == vec![1, 2, 3]));
        assert_eq!(state(&shared).1, vec![1, 2]);
    }

    #[tokio::test]
    async fn refusals_and_no_leader_end_in_clear_errors() {
        let (http, shared) = fake_cluster(Fake {
            leader: 1,
            voters: vec![1, 2],
            refuse: true,
            ..Fake::default()
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = ensure_voters(&http, &[1, 2, 3], deadline)
            .await
            .expect_err("a 400 is final");
        assert!(err.to_string().contains("refused"), "{err:#}");
        assert_eq!(state(&shared).2, 1, "a refusal is not retried");
        shared.lock().unwrap_or_else(|e| e.into_inner()).leader = 0;
        let started = Instant::now();
        let err = ensure_voters(&http, &[1, 2, 3], started + Duration::from_millis(700))
            .await
            .expect_err("no leader");
        assert!(err.to_string().contains("no node says it leads"), "{err:#}");
        assert!(started.elapsed() < Duration::from_secs(5), "bounded");
        let err = ensure_voters(&http, &[], deadline)
            .await
            .expect_err("empty");
        assert!(err.to_string().contains("empty"), "{err:#}");
    }

    #[tokio::test]
    async fn transfers_move_leadership_among_the_voters() {
        let (http, shared) = fake_cluster(Fake {
            leader: 1,
            voters: vec![1, 2, 3],
            ..Fake::default()
        })
        .await;
        let history = History::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let end = Instant::now() + Duration::from_millis(1500);
        let moves = transfers(&http, &history, &[1, 2, 3], end, &mut rng).await;
        assert!(Instant::now() >= end, "it holds until the end");
        assert_eq!(moves.len(), 1, "{moves:?}");
        let first = &moves[0];
        assert_eq!(first.from, 1);
        assert!(matches!(first.to, 2 | 3), "{first:?}");
        assert_eq!(first.leader, Some(first.to));
        assert_eq!(state(&shared).0, first.to);
        // A demoted node is never made leader: only the leader's current voters are.
        shared.lock().unwrap_or_else(|e| e.into_inner()).voters = vec![1, 2];
        shared.lock().unwrap_or_else(|e| e.into_inner()).leader = 2;
        let end = Instant::now() + Duration::from_millis(1200);
        let moves = transfers(&http, &history, &[1, 2, 3], end, &mut rng).await;
        assert_eq!(
            moves.iter().map(|m| (m.from, m.to)).collect::<Vec<_>>(),
            vec![(2, 1)]
        );
    }

    #[test]
    fn moves_describe_themselves() {
        let mut mv = Move {
            at_ms: 10,
            from: 1,
            to: 2,
            millis: 640,
            leader: Some(2),
            error: None,
        };
        assert_eq!(mv.describe(), "1->2 ok 640ms");
        mv.leader = Some(3);
        assert_eq!(mv.describe(), "1->2 ok 640ms (leader 3)");
        mv.leader = None;
        mv.error = Some("503 no_leader".into());
        assert_eq!(mv.describe(), "1->2 failed: 503 no_leader");
    }
}
