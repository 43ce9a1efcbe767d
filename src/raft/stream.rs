//! Pipelined replication: the appends to one follower sent as one streamed request.
//!
//! openraft hands a follower's replication a stream of append requests and reads a stream of
//! answers back, in the same order ([`openraft::RaftNetworkV2::stream_append`]). Sent one HTTP
//! request at a time, each append waits for the answer to the one before it (the follower's
//! write, fsync and round trip) before it leaves. Here one `POST /raft/append-stream` carries
//! them all: its body is the requests, each framed as it is produced, and its answer's body is
//! the answers, each framed as the follower's Raft core gives it (after the entries are
//! fsynced), so several appends are in flight at once. One connection keeps them in order.
//!
//! A frame is a `u32` length (little-endian) and the codec encoding of one value. A frame over
//! the body limit, or one that does not decode, ends the stream as an error; so does a
//! request left unanswered for longer than the RPC timeout openraft gives the stream. A peer
//! that does not know the endpoint (404: a node of a release before it) is sent one request
//! at a time, as before.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use openraft::error::{RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use super::network::{network_err, refused, send_err};
use super::{NodeId, TypeConfig};
use crate::codec;

/// The endpoint, under `/raft/`.
pub const PATH: &str = "append-stream";

/// What the follower answers for each request: openraft's result, or why its Raft core could
/// not give one (it stopped), which ends the stream.
pub type Answer = Result<StreamAppendResult<TypeConfig>, String>;

/// Requests encoded but not yet taken by the connection: a bound on what waits in memory.
const SEND_QUEUE: usize = 64;

/// One value as a frame.
pub fn frame<T: Serialize>(value: &T) -> Result<Bytes, bincode::Error> {
    let body = codec::encode(value)?;
    let len = u32::try_from(body.len())
        .map_err(|_| bincode::ErrorKind::Custom(format!("a frame of {} bytes", body.len())))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend(body);
    Ok(out.into())
}

/// Frames taken out of a byte stream as its chunks arrive.
pub struct Frames {
    buf: BytesMut,
    limit: u64,
}

impl Frames {
    /// Frames of at most `limit` bytes each.
    pub fn new(limit: u64) -> Self {
        Frames {
            buf: BytesMut::new(),
            limit,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame's value, `Ok(None)` while its bytes have not all arrived, or why
    /// the stream cannot go on.
    pub fn take<T: DeserializeOwned>(&mut self) -> Result<Option<T>, String> {
        let Some(prefix) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as u64;
        if len > self.limit {
            return Err(format!(
                "a frame of {len} bytes is over the limit of {}",
                self.limit
            ));
        }
        let end = 4 + len as usize;
        if self.buf.len() < end {
            return Ok(None);
        }
        let value = codec::decode_limited(&self.buf[4..end], self.limit)
            .map_err(|e| format!("undecodable frame: {e}"))?;
        self.buf.advance(end);
        Ok(Some(value))
    }

    /// Whether bytes of an unfinished frame are left.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

type Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// Stops the task that sends the requests when the answers are no longer read.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open stream: `body` is the answer's body, the requests are being written by a task.
struct Reading {
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    frames: Frames,
    /// When each request not yet answered was handed to the connection, oldest first.
    sent: Arc<Mutex<VecDeque<Instant>>>,
    ttl: Duration,
    target: NodeId,
    _sender: AbortOnDrop,
}

impl Reading {
    /// The next answer; `None` once the follower ended the stream with every request answered.
    async fn next(&mut self) -> Option<Item> {
        loop {
            match self.frames.take::<Answer>() {
                Ok(Some(answer)) => {
                    let asked = self.sent.lock().map(|mut s| s.pop_front()).ok().flatten();
                    if asked.is_none() {
                        return Some(Err(network_err(format!(
                            "peer {} answered an append it was not sent",
                            self.target
                        ))));
                    }
                    return Some(answer.map_err(|e| {
                        RPCError::Unreachable(Unreachable::from_string(format!(
                            "peer {} stopped: {e}",
                            self.target
                        )))
                    }));
                }
                Ok(None) => {}
                Err(e) => return Some(Err(network_err(format!("peer {}: {e}", self.target)))),
            }
            // Wait for more bytes, at most until the oldest request's answer is overdue (then
            // the stream is given up as a timed-out RPC), or a while if none is waiting.
            let oldest = self.sent.lock().ok().and_then(|s| s.front().copied());
            let until = oldest.map_or(Instant::now() + self.ttl, |t| t + self.ttl);
            match tokio::time::timeout_at(until, self.body.next()).await {
                Ok(Some(Ok(chunk))) => self.frames.push(&chunk),
                Ok(Some(Err(e))) => return Some(Err(network_err(e))),
                Ok(None) => {
                    let waiting = self.sent.lock().map(|s| s.len()).unwrap_or(0);
                    if waiting == 0 && self.frames.is_empty() {
                        return None;
                    }
                    return Some(Err(network_err(format!(
                        "peer {} ended the append stream with {waiting} requests unanswered",
                        self.target
                    ))));
                }
                Err(_) if oldest.is_some() => {
                    // As a single append whose answer does not come in time.
                    return Some(Err(network_err(format!(
                        "peer {} did not answer an append within {:?}",
                        self.target, self.ttl
                    ))));
                }
                Err(_) => {}
            }
        }
    }
}

/// The requests handed back when the peer does not know the endpoint: the first, taken
/// before connecting, then the rest.
pub type HandedBack<S> = futures::stream::Chain<
    futures::stream::Iter<std::option::IntoIter<AppendEntriesRequest<TypeConfig>>>,
    S,
>;

/// Opens the stream `request` asks for (a Raft RPC to [`PATH`] on peer `target`) and starts
/// sending `input` on it: the answers, in order, or `Ok(Err(input))` when the peer does not
/// know the endpoint.
///
/// Nothing is dialled before `input` gives its first request: after a failed stream,
/// openraft waits out its backoff inside that first item. Connecting first would dial a peer
/// that is down again at once, thousands of times a second.
pub async fn open<S>(
    request: reqwest::RequestBuilder,
    target: NodeId,
    decode_limit: u64,
    ttl: Duration,
    mut input: S,
) -> Result<Result<BoxStream<'static, Item>, HandedBack<S>>, RPCError<TypeConfig>>
where
    S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let Some(first) = input.next().await else {
        return Ok(Ok(futures::stream::empty().boxed()));
    };
    let input = futures::stream::iter(Some(first)).chain(input);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(SEND_QUEUE);
    let requests = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    let send = request.body(reqwest::Body::wrap_stream(requests)).send();
    // The follower answers the request's head at once; only that is bounded here.
    let resp = match tokio::time::timeout(ttl.max(Duration::from_secs(1)), send).await {
        Err(_) => return Err(network_err(format!("peer {target}: no answer to {PATH}"))),
        Ok(result) => result.map_err(send_err)?,
    };
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(Err(input));
    }
    if !status.is_success() {
        let bytes = resp.bytes().await.unwrap_or_default();
        return Err(refused(target, status, &bytes));
    }
    let sent = Arc::new(Mutex::new(VecDeque::new()));
    let sender = {
        let sent = sent.clone();
        let mut input = input;
        tokio::spawn(async move {
            while let Some(req) = input.next().await {
                let bytes = match frame(&req) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::error!(target, "encoding an append request: {e}");
                        return;
                    }
                };
                if let Ok(mut s) = sent.lock() {
                    s.push_back(Instant::now());
                }
                if tx.send(bytes).await.is_err() {
                    return;
                }
            }
        })
    };
    let reading = Reading {
        body: resp.bytes_stream().boxed(),
        frames: Frames::new(decode_limit),
        sent,
        ttl,
        target,
        _sender: AbortOnDrop(sender),
    };
    let answers = futures::stream::unfold(Some(reading), |state| async move {
        let mut reading = state?;
        let item = reading.next().await?;
        // An error, or an answer that stops the follower's side (a conflict, a higher
        // vote), is the stream's last item.
        let go_on = matches!(item, Ok(Ok(_)));
        Some((item, go_on.then_some(reading)))
    });
    Ok(Ok(answers.boxed()))
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
