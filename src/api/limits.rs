//! Load limits of one node: what it holds at once, so a flood gets 429 `overloaded` (with
//! `Retry-After`) instead of memory without end.
//!
//! - Requests in flight on `/v1` (`max_requests_in_flight`): each request holds a slot until it
//!   is answered.
//! - Request body bytes in flight (`max_body_bytes_in_flight`): a request reserves its declared
//!   length (the largest allowed body when it is chunked, nothing when it has no body) before
//!   its body is read.
//! - Long-polls waiting (`max_long_polls`): a read or pull that would wait for new records takes
//!   a slot for as long as it waits; one that can be answered at once takes none.
//!
//! A refused request has done nothing: the check runs before the body is read, or (for a
//! long-poll) before waiting, after a look that changed nothing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use crate::config::Settings;

/// Body bytes are counted in KiB so that a semaphore's `u32` permits cover any budget.
const UNIT: u64 = 1024;

/// The node's counters of what it holds.
#[derive(Debug)]
pub struct Limits {
    requests: Arc<Semaphore>,
    body_units: Arc<Semaphore>,
    long_polls: Arc<Semaphore>,
    max_requests: usize,
    max_body_bytes: u64,
    max_body_bytes_in_flight: u64,
    max_long_polls: usize,
}

fn units(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).min(u64::from(u32::MAX)) as u32
}

impl Limits {
    pub fn new(s: &Settings) -> Limits {
        Limits {
            requests: Arc::new(Semaphore::new(s.max_requests_in_flight)),
            body_units: Arc::new(Semaphore::new(units(s.max_body_bytes_in_flight) as usize)),
            long_polls: Arc::new(Semaphore::new(s.max_long_polls)),
            max_requests: s.max_requests_in_flight,
            max_body_bytes: s.max_body_bytes as u64,
            max_body_bytes_in_flight: s.max_body_bytes_in_flight,
            max_long_polls: s.max_long_polls,
        }
    }

    /// A slot for a long-poll about to wait, or 429 when every slot is taken.
    pub fn long_poll(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.long_polls.clone().try_acquire_owned().map_err(|_| {
            ApiError::overloaded(format!(
                "{} long-polls already wait on this node; retry later, or poll without waiting",
                self.max_long_polls
            ))
        })
    }
}

/// Admits a `/v1` request only while the node holds less than its limits.
pub async fn load_gate(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    let Ok(request_slot) = limits.requests.clone().try_acquire_owned() else {
        return ApiError::overloaded(format!(
            "this node is answering {} requests already; retry later",
            limits.max_requests
        ))
        .into_response();
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A body larger than one request may carry is refused by the body limit anyway; reserve
    // no more than that. A chunked body (no declared length) may be that large; a request
    // with neither header has no body (HTTP/1.1) and reserves nothing.
    let chunked = req.headers().contains_key(header::TRANSFER_ENCODING);
    let reserve = match declared {
        Some(n) => n.min(limits.max_body_bytes),
        None if chunked => limits.max_body_bytes,
        None => 0,
    };
    let body_slot = if reserve == 0 {
        None
    } else {
        match limits
            .body_units
            .clone()
            .try_acquire_many_owned(units(reserve))
        {
            Ok(p) => Some(p),
            Err(_) => {
                return ApiError::overloaded(format!(
                    "this node holds {} MiB of request bodies already; retry later",
                    limits.max_body_bytes_in_flight >> 20
                ))
                .into_response()
            }
        }
    };
    let resp = next.run(req).await;
    drop((body_slot, request_slot));
    resp
}
