//! What a subscription is made of: its settings, leases, pending redeliveries, counters and
//! cursor (`SubState`, stored), the receipts it hands out, and the commands that act on it.

use serde::{Deserialize, Serialize};

use super::OffsetMap;
use crate::ranges::RangeSet;

/// Lease length when neither the pull nor the subscription sets one.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;

/// Where a new subscription's cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Start {
    First,
    Next,
    Offset(u64),
}

/// A subscription's settings as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubSettings {
    pub start: Start,
    pub ack_timeout_ms: u64,
    pub max_deliveries: Option<u32>,
    pub dead_letter_topic: Option<String>,
}

/// One live delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Names this delivery (part of the receipt); unique within the subscription.
    pub lease_id: u64,
    pub delivery_count: u32,
    pub expires_ms: u64,
}

/// A record delivered before and available again (after `not_before_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub delivery_count: u32,
    pub not_before_ms: u64,
    /// The delivery whose lease expired: its receipt still works until the record is
    /// delivered again. `None` after an explicit nack: the consumer gave the record up.
    pub last_lease_id: Option<u64>,
}

/// Cumulative counters; they never decrease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubCounters {
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub expired_leases: u64,
    /// Appended to the dead-letter topic.
    pub dead_lettered: u64,
    /// Discarded for want of a dead-letter topic, by reason.
    pub discarded_max_deliveries: u64,
    pub discarded_rejected: u64,
    /// Offsets a forward cursor move passed over before they were done.
    pub skipped: u64,
    /// Offsets a backward cursor move made count again (they were accounted for once).
    pub rewound: u64,
    /// Records retention removed from the topic before this subscription was done with them.
    pub discarded_retention: u64,
}

/// The replicated state of one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubState {
    /// Unique for the life of the cluster; part of every receipt.
    pub id: u64,
    pub topic: String,
    pub name: String,
    pub settings: SubSettings,
    /// The cursor when the subscription was created: it accounts for every offset from here.
    pub origin: u64,
    /// Every offset below it is done.
    pub cursor: u64,
    /// Lowest offset never delivered (at or above the cursor).
    pub next_fresh: u64,
    /// Done offsets at or above the cursor.
    pub done: RangeSet,
    /// Live deliveries by offset. Stored one key per offset beside the rest of the
    /// subscription, so that an apply writes the leases it changed, not all of them.
    pub leases: OffsetMap<Lease>,
    /// Records available again (or soon) by offset; stored like `leases`.
    pub pending: OffsetMap<Pending>,
    pub next_lease_id: u64,
    pub counters: SubCounters,
}

impl SubState {
    /// Records neither done nor leased, between the cursor and `high_watermark`.
    pub fn backlog(&self, high_watermark: u64) -> u64 {
        let span = high_watermark.saturating_sub(self.cursor);
        span.saturating_sub(self.done.len())
            .saturating_sub(self.leases.len() as u64)
    }

    /// Whether a pull at time `now` would lease something.
    pub fn has_available(&self, high_watermark: u64, now_ms: u64) -> bool {
        self.next_fresh < high_watermark || self.pending.values().any(|p| p.not_before_ms <= now_ms)
    }

    /// Offsets it has had to account for, up to `high_watermark`: from its origin, plus those
    /// a backward move made count again. Balance:
    /// `seen == acked + dead_lettered_total + skipped + discarded_retention + backlog +
    /// in_flight`.
    pub fn seen(&self, high_watermark: u64) -> u64 {
        high_watermark.saturating_sub(self.origin) + self.counters.rewound
    }

    /// The dead-lettered and discarded total.
    pub fn dead_lettered_total(&self) -> u64 {
        self.counters.dead_lettered
            + self.counters.discarded_max_deliveries
            + self.counters.discarded_rejected
    }

    pub(super) fn advance_cursor(&mut self) {
        while let Some(end) = self.done.take_run_at(self.cursor) {
            self.cursor = end;
        }
        self.next_fresh = self.next_fresh.max(self.cursor);
    }
}

/// A receipt: one delivery of one record of one subscription. Printed as
/// `SUB.OFFSET.LEASE` (three decimal numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub sub_id: u64,
    pub offset: u64,
    pub lease_id: u64,
}

impl Receipt {
    pub fn parse(text: &str) -> Option<Receipt> {
        let mut parts = text.split('.');
        let mut next = || parts.next().and_then(|p| p.parse::<u64>().ok());
        let r = Receipt {
            sub_id: next()?,
            offset: next()?,
            lease_id: next()?,
        };
        parts.next().is_none().then_some(r)
    }
}

impl std::fmt::Display for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.sub_id, self.offset, self.lease_id)
    }
}

/// One leased record, as a pull answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub receipt: Receipt,
    pub delivery_count: u32,
    pub expires_ms: u64,
}

/// What an ack, nack or extend did to one receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReceiptOutcome {
    Acked,
    Released,
    DeadLettered,
    Extended { expires_ms: u64 },
    Stale,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSub {
    pub topic: String,
    pub name: String,
    pub settings: SubSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRef {
    pub topic: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    pub sub: SubRef,
    pub max: u32,
    pub ack_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReceiptAction {
    Ack,
    Nack { delay_ms: u64, dead_letter: bool },
    Extend { ack_timeout_ms: Option<u64> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleReceipts {
    pub sub: SubRef,
    pub action: ReceiptAction,
    pub receipts: Vec<Receipt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetCursor {
    pub sub: SubRef,
    pub offset: u64,
    pub allow_backward: bool,
    /// From a read with `from`: a cursor at or above `offset` is left alone, never an error.
    pub forward_only: bool,
}
