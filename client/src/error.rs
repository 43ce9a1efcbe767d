//! The SDK's error type.
//!
//! The variants are sorted by what the caller may conclude about a write, because that is the
//! question a queue client must answer honestly: [`Error::Api`] and [`Error::Unavailable`] mean
//! the request was **not** applied, [`Error::Indeterminate`] means it **may** have been,
//! and the rest never left this process (or, for [`Error::Decode`], succeeded but could not be
//! understood).

use crate::api::{ErrorCode, Problem};

/// Everything a [`Client`](crate::Client) call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server gave a definite answer that the request was refused (a 4xx problem, such as
    /// `topic_not_found`, `sequence_gap` or `already_exists`). The call had no effect: when an
    /// earlier attempt of the same call may have been applied, a later refusal is reported as
    /// [`Error::Indeterminate`] instead.
    ///
    /// A 4xx answer without a problem body (a proxy, an older server) is reported here too,
    /// with a problem synthesized from the status (`type` is `about:blank`).
    #[error("{0}")]
    Api(Box<Problem>),

    /// The outcome of a write is unknown: some attempt may have reached the server and been
    /// applied, but no answer says so. A time-out after the request was sent, a reset
    /// connection, or a 5xx other than `no_leader`/`shutting_down` leave a write in this state.
    ///
    /// Only writes end here. Re-sending the same batch with the same `producer_id` and
    /// `sequence` is how to settle it: the server answers the original offsets if the first
    /// attempt was applied. Without them, re-sending may publish the records twice.
    #[error("outcome unknown, the request may or may not have been applied: {detail}")]
    Indeterminate {
        /// What happened, for humans.
        detail: String,
    },

    /// The call's deadline passed without a definite answer, and no attempt can have been
    /// applied: every attempt was refused before reaching a leader's log (no leader,
    /// shutting down, overloaded, too many redirects) or never connected.
    ///
    /// For a read this is the only "gave up" error; for a write it promises the write did not
    /// happen (otherwise the error is [`Error::Indeterminate`]).
    #[error("no definite answer before the deadline, the request was not applied: {detail}")]
    Unavailable {
        /// What the attempts ran into, for humans.
        detail: String,
        /// The code of the last refusal seen (`no_leader`, `shutting_down`, `overloaded`,
        /// `not_leader` for a redirect loop), or `None` when the last failure was a transport
        /// error.
        last_code: Option<ErrorCode>,
    },

    /// A base URL given to the client, or one a server redirected to, is not usable.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The server answered with a success status, but the body is not what API.md promises.
    /// For a write the status alone means it **was** applied; only its details (offsets) are
    /// lost.
    #[error("cannot decode the server's answer: {detail}")]
    Decode {
        /// The parse error and the start of the body.
        detail: String,
    },

    /// A call's arguments were rejected before anything was sent (an invalid topic name, an
    /// empty batch, a long-poll longer than the server allows).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// The API error code: the server's code for [`Error::Api`], the last refusal's code for
    /// [`Error::Unavailable`], `None` otherwise.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Api(problem) => Some(problem.code),
            Error::Unavailable { last_code, .. } => *last_code,
            _ => None,
        }
    }

    /// The server's problem body, for [`Error::Api`].
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api(problem) => Some(&**problem),
            _ => None,
        }
    }

    /// The HTTP status of a definite API error.
    pub fn status(&self) -> Option<u16> {
        self.problem().map(|problem| problem.status)
    }

    /// True when a write that failed with this error may nevertheless have been applied, so
    /// the caller must not assume it is safe to treat it as "not done". This is true for
    /// [`Error::Indeterminate`] and for [`Error::Decode`] (the server said success).
    pub fn may_have_been_applied(&self) -> bool {
        matches!(self, Error::Indeterminate { .. } | Error::Decode { .. })
    }

    /// True when the server definitely refused the request with `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        matches!(self, Error::Api(problem) if problem.code == code)
    }
}

/// Why a [`Producer`](crate::Producer) call failed, or why the producer stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    /// Options, the topic name, or a record were rejected before anything was done.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The spool directory cannot be used: an I/O error, or a damaged file. After an I/O error
    /// while running, the producer stops (what the spool holds is still consistent: a failed
    /// write is never acted on).
    #[error("spool {}: {detail}", path.display())]
    Spool {
        /// The spool directory.
        path: std::path::PathBuf,
        /// What went wrong and what to do.
        detail: String,
    },
    /// Another producer (in this process or another) holds the spool's lock.
    #[error(
        "spool {} is in use by another producer (its LOCK is held); a spool serves one producer \
         at a time",
        path.display()
    )]
    SpoolInUse {
        /// The spool directory.
        path: std::path::PathBuf,
    },
    /// The spool belongs to another topic or another producer id.
    #[error("spool {} is not this producer's: {detail}", path.display())]
    ForeignSpool {
        /// The spool directory.
        path: std::path::PathBuf,
        /// Whose it is, and what to do.
        detail: String,
    },
    /// The server no longer knows this producer while some of its batches are unsettled:
    /// whether they were appended cannot be known. The producer stopped.
    #[error("{detail}")]
    ProducerForgotten {
        /// Which records are concerned, and what to do.
        detail: String,
    },
    /// The producer cannot tell where the server's sequence for it stands, and stopped.
    #[error("the producer stopped: it cannot tell what the server holds: {detail}")]
    Desynchronized {
        /// What contradicted what.
        detail: String,
    },
    /// The producer was closed or aborted.
    #[error("the producer is closed")]
    Closed,
}
