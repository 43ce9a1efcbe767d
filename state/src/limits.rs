//! The limits and name rules apply enforces. They are part of what old log entries mean: a
//! command is refused or accepted by these values when it is replayed, so they change only with
//! care (a tighter limit would refuse, on replay, a command that was accepted when it was first
//! applied). The SDK keeps its own copies for checks before sending; a test in the server crate
//! checks that the two agree.

/// Longest topic, subscription or producer name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// True when `name` is a valid topic, subscription or producer name: `[A-Za-z0-9._-]{1,128}`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Most records one pull leases.
pub const MAX_PULL: u32 = 1_000;
/// Longest lease a pull or extend may ask for (12 hours).
pub const MAX_ACK_TIMEOUT_MS: u64 = 12 * 60 * 60 * 1000;
/// Longest nack delay (12 hours).
pub const MAX_NACK_DELAY_MS: u64 = 12 * 60 * 60 * 1000;

/// Default upper bound on one record (value + key + headers) when a topic sets none.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 20;
/// The largest `max_record_bytes` a topic may configure.
pub const MAX_RECORD_BYTES_LIMIT: u64 = 16 << 20;
