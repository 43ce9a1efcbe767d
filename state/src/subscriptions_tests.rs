//! Subscription state machine tests: a property test against a plain reference model, and
//! table tests for the rules the model does not cover (dead-letter records, seeks, errors).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::subscriptions::{Lease, OffsetMap, Pending};
use super::*;

/// A record store for tests: what apply wrote, as RocksDB would hold it.
#[derive(Default)]
pub(super) struct Records(pub(super) BTreeMap<(u64, u64), StoredRecord>);

impl RecordSource for Records {
    fn stored(&self, topic_id: u64, offset: u64) -> Result<Option<StoredRecord>, ReadFault> {
        Ok(self.0.get(&(topic_id, offset)).cloned())
    }

    /// The harness applies one entry per call, so every record not stored yet is in it.
    fn logged(&self, at: RecordAt, _timestamp_ms: u64) -> Result<StoredRecord, String> {
        Err(format!("entry {} is not the one being applied", at.index))
    }
}

/// A subscription's leases and pending redeliveries as the store holds them: one entry per
/// offset, written only for the offsets an apply changed.
type StoredDeliveries = (BTreeMap<u64, Lease>, BTreeMap<u64, Pending>);

/// A state machine plus its record store, applying one command per entry.
pub(super) struct Harness {
    pub(super) state: SmState,
    pub(super) records: Records,
    /// What the store holds of each subscription's leases and pending redeliveries, kept the
    /// way the store keeps it (only changed offsets written); checked against the state after
    /// every entry.
    stored_subs: BTreeMap<u64, StoredDeliveries>,
    pub(super) clock: u64,
    pub(super) index: u64,
}

/// Writes a changed offset of `live` into `stored`, as the store does: the current entry, or
/// its removal.
fn store_changed<V: Clone>(stored: &mut BTreeMap<u64, V>, live: &mut OffsetMap<V>) {
    for offset in live.take_changed() {
        match live.get(&offset) {
            Some(v) => stored.insert(offset, v.clone()),
            None => stored.remove(&offset),
        };
    }
}

impl Harness {
    pub(super) fn new() -> Self {
        Harness {
            state: SmState::default(),
            records: Records::default(),
            stored_subs: BTreeMap::new(),
            clock: 1_000,
            index: 0,
        }
    }

    pub(super) fn run(&mut self, cmd: Command) -> CommandResult {
        self.index += 1;
        let mut writes = Vec::new();
        let batch = Batch {
            timestamp_ms: self.clock,
            commands: vec![cmd],
        };
        let resp = apply_entry(
            &mut self.state,
            &self.records,
            self.index,
            &batch,
            &mut writes,
        )
        .expect("no record read fails");
        for w in writes {
            match w {
                Write::PutRecord {
                    topic_id,
                    offset,
                    record,
                } => {
                    let record = match record {
                        Appended::Whole(r) => r,
                        Appended::Logged { timestamp_ms, at } => {
                            record_at(&batch, at, timestamp_ms).expect("the entry holds it")
                        }
                    };
                    self.records.0.insert((topic_id, offset), record);
                }
                Write::DeleteTopic { id, .. } => self.records.0.retain(|(t, _), _| *t != id),
                Write::TrimTopic { topic_id, from, to } => self
                    .records
                    .0
                    .retain(|(t, o), _| *t != topic_id || *o < from || *o >= to),
                Write::PutSub(id) => {
                    if let Some(sub) = self.state.subs.get_mut(&id) {
                        let stored = self.stored_subs.entry(id).or_default();
                        store_changed(&mut stored.0, &mut sub.leases);
                        store_changed(&mut stored.1, &mut sub.pending);
                    }
                }
                Write::DeleteSub(id) => {
                    self.stored_subs.remove(&id);
                }
                _ => {}
            }
        }
        // Writing only what changed leaves the store holding every lease and pending
        // redelivery as they are: no change escaped its record, or its `PutSub`.
        for (id, sub) in &self.state.subs {
            let stored = self.stored_subs.get(id).cloned().unwrap_or_default();
            assert_eq!(stored.0, *sub.leases, "stored leases of subscription {id}");
            assert_eq!(
                stored.1, *sub.pending,
                "stored pending of subscription {id}"
            );
        }
        assert!(
            self.stored_subs
                .keys()
                .all(|id| self.state.subs.contains_key(id)),
            "a deleted subscription's leases stay stored"
        );
        resp.results.into_iter().next().expect("one result")
    }

    pub(super) fn ok(&mut self, cmd: Command) -> Outcome {
        self.run(cmd).expect("command should succeed")
    }

    pub(super) fn topic(&mut self, name: &str) {
        self.ok(Command::CreateTopic(CreateTopic {
            name: name.into(),
            settings: TopicSettings::default(),
        }));
    }

    pub(super) fn publish(&mut self, topic: &str, values: &[&str]) {
        let records = values
            .iter()
            .map(|v| NewRecord {
                key: Some(format!("k-{v}")),
                headers: vec![("h".into(), v.to_string())],
                value: v.as_bytes().to_vec(),
            })
            .collect();
        self.ok(Command::Publish(Publish {
            topic: topic.into(),
            records,
            producer: None,
        }));
    }

    pub(super) fn subscribe(&mut self, topic: &str, name: &str, settings: SubSettings) {
        self.ok(Command::CreateSubscription(CreateSub {
            topic: topic.into(),
            name: name.into(),
            settings,
        }));
    }

    fn pull(&mut self, max: u32, timeout: Option<u64>) -> Vec<Delivery> {
        match self.ok(Command::Pull(Pull {
            sub: sref(),
            max,
            ack_timeout_ms: timeout,
        })) {
            Outcome::Pulled(d) => d,
            other => panic!("pull answered {other:?}"),
        }
    }

    fn settle(&mut self, action: ReceiptAction, receipts: Vec<Receipt>) -> Vec<ReceiptOutcome> {
        match self.ok(Command::SettleReceipts(SettleReceipts {
            sub: sref(),
            action,
            receipts,
        })) {
            Outcome::Receipts(r) => r,
            other => panic!("settle answered {other:?}"),
        }
    }

    /// Nacks `receipt` with `dead_letter: true` and no delay.
    fn dead_letter_now(&mut self, receipt: Receipt) -> Vec<ReceiptOutcome> {
        self.settle(
            ReceiptAction::Nack {
                delay_ms: 0,
                dead_letter: true,
            },
            vec![receipt],
        )
    }

    fn sub(&self) -> &SubState {
        self.state.sub("t", "s").expect("subscription")
    }
}

fn sref() -> SubRef {
    SubRef {
        topic: "t".into(),
        name: "s".into(),
    }
}

pub(super) fn settings(
    ack_timeout_ms: u64,
    max_deliveries: Option<u32>,
    dlq: Option<&str>,
) -> SubSettings {
    SubSettings {
        start: Start::First,
        ack_timeout_ms,
        max_deliveries,
        dead_letter_topic: dlq.map(String::from),
    }
}

// ----- the reference model --------------------------------------------------------------

/// What the model knows of one offset.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Fresh,
    Leased {
        lease: u64,
        count: u32,
        expires: u64,
    },
    Pending {
        count: u32,
        not_before: u64,
        last_lease: Option<u64>,
    },
    Done,
}

/// The plainest possible subscription: one slot per offset, everything by linear scans.
struct Model {
    slots: Vec<Slot>,
    max_deliveries: Option<u32>,
    timeout: u64,
    /// Offsets dead-lettered, in order.
    dead: Vec<(u64, &'static str, u32)>,
}

impl Model {
    /// Ends every lease due at `now`, earliest expiry first (then lowest offset).
    fn expire(&mut self, now: u64) {
        let mut due: Vec<(u64, usize, u32, u64)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match *s {
                Slot::Leased {
                    lease,
                    count,
                    expires,
                } if expires <= now => Some((expires, i, count, lease)),
                _ => None,
            })
            .collect();
        due.sort();
        for (expires, i, count, lease) in due {
            self.fail(i, count, Some(lease), expires, "max_deliveries");
        }
    }

    fn fail(
        &mut self,
        i: usize,
        count: u32,
        lease: Option<u64>,
        not_before: u64,
        reason: &'static str,
    ) {
        if self.max_deliveries.is_some_and(|m| count >= m) {
            self.slots[i] = Slot::Done;
            self.dead.push((i as u64, reason, count));
        } else {
            self.slots[i] = Slot::Pending {
                count,
                not_before,
                last_lease: lease,
            };
        }
    }

    fn cursor(&self) -> u64 {
        self.slots
            .iter()
            .position(|s| *s != Slot::Done)
            .unwrap_or(self.slots.len()) as u64
    }

    /// The live delivery a receipt names: its slot index, count and lease.
    fn live(&self, r: &Receipt) -> Option<(usize, u32, u64)> {
        match self.slots.get(r.offset as usize)? {
            Slot::Leased { lease, count, .. } if *lease == r.lease_id => {
                Some((r.offset as usize, *count, *lease))
            }
            Slot::Pending {
                count,
                last_lease: Some(l),
                ..
            } if *l == r.lease_id => Some((r.offset as usize, *count, *l)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Publish(usize),
    Pull(u32, Option<u64>),
    Ack(usize),
    Nack(usize, u64, bool),
    Extend(usize, Option<u64>),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..4).prop_map(Op::Publish),
        (1u32..4, prop::option::of(50u64..400)).prop_map(|(m, t)| Op::Pull(m, t)),
        any::<usize>().prop_map(Op::Ack),
        (
            any::<usize>(),
            prop_oneof![Just(0u64), 1u64..300],
            any::<bool>()
        )
            .prop_map(|(i, d, dl)| Op::Nack(i, d, dl)),
        (any::<usize>(), prop::option::of(50u64..400)).prop_map(|(i, t)| Op::Extend(i, t)),
        (0u64..500).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The state machine agrees with the model on every answer, and keeps its invariants:
    /// no record lost, none leased twice at once, the cursor never above an unacked offset,
    /// availability in offset order, every dead letter in the dead-letter topic exactly once.
    #[test]
    fn subscription_matches_reference_model(
        ops in proptest::collection::vec(op(), 1..120),
        max_deliveries in prop::option::of(1u32..4),
    ) {
        let mut h = Harness::new();
        h.topic("t");
        h.topic("dlq");
        h.subscribe("t", "s", settings(200, max_deliveries, Some("dlq")));
        let mut m = Model { slots: vec![], max_deliveries, timeout: 200, dead: vec![] };
        let mut receipts: Vec<Receipt> = Vec::new();
        let mut published = 0u64;

        for op in ops {
            // Every entry settles what fell due at its time first, as the model does here.
            m.expire(h.clock);
            match op {
                Op::Publish(n) => {
                    let values: Vec<String> = (0..n).map(|i| format!("v{}", published + i as u64)).collect();
                    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
                    h.publish("t", &refs);
                    published += n as u64;
                    m.slots.extend(std::iter::repeat_n(Slot::Fresh, n));
                }
                Op::Pull(max, timeout) => {
                    let got = h.pull(max, timeout);
                    let now = h.clock;
                    let expires = now + timeout.unwrap_or(m.timeout);
                    let want: Vec<usize> = (0..m.slots.len())
                        .filter(|i| match m.slots[*i] {
                            Slot::Fresh => true,
                            Slot::Pending { not_before, .. } => not_before <= now,
                            _ => false,
                        })
                        .take(max as usize)
                        .collect();
                    let got_offsets: Vec<usize> = got.iter().map(|d| d.receipt.offset as usize).collect();
                    prop_assert_eq!(&got_offsets, &want, "pull leases the lowest available offsets");
                    for d in &got {
                        let i = d.receipt.offset as usize;
                        let count = match m.slots[i] {
                            Slot::Fresh => 1,
                            Slot::Pending { count, .. } => count + 1,
                            ref other => return Err(TestCaseError::fail(format!("leased twice: {other:?}"))),
                        };
                        prop_assert_eq!(d.delivery_count, count);
                        prop_assert_eq!(d.expires_ms, expires);
                        m.slots[i] = Slot::Leased { lease: d.receipt.lease_id, count, expires };
                        receipts.push(d.receipt);
                    }
                }
                Op::Ack(pick) | Op::Nack(pick, ..) | Op::Extend(pick, _) if receipts.is_empty() => {
                    let _ = pick;
                }
                Op::Ack(pick) => {
                    let r = receipts[pick % receipts.len()];
                    let got = h.settle(ReceiptAction::Ack, vec![r]);
                    let want = match m.live(&r) {
                        Some((i, ..)) => { m.slots[i] = Slot::Done; ReceiptOutcome::Acked }
                        None => ReceiptOutcome::Stale,
                    };
                    prop_assert_eq!(got, vec![want]);
                }
                Op::Nack(pick, delay, dead_letter) => {
                    let r = receipts[pick % receipts.len()];
                    let got = h.settle(ReceiptAction::Nack { delay_ms: delay, dead_letter }, vec![r]);
                    let want = match m.live(&r) {
                        None => ReceiptOutcome::Stale,
                        Some((i, count, _)) if dead_letter => {
                            m.slots[i] = Slot::Done;
                            m.dead.push((i as u64, "nack", count));
                            ReceiptOutcome::DeadLettered
                        }
                        Some((i, count, _)) => {
                            // An explicit nack gives the record up: its receipt is stale now.
                            m.fail(i, count, None, h.clock + delay, "max_deliveries");
                            if m.slots[i] == Slot::Done { ReceiptOutcome::DeadLettered } else { ReceiptOutcome::Released }
                        }
                    };
                    prop_assert_eq!(got, vec![want]);
                }
                Op::Extend(pick, timeout) => {
                    let r = receipts[pick % receipts.len()];
                    let got = h.settle(ReceiptAction::Extend { ack_timeout_ms: timeout }, vec![r]);
                    let want = match m.live(&r) {
                        None => ReceiptOutcome::Stale,
                        Some((i, count, lease)) => {
                            let expires = h.clock + timeout.unwrap_or(m.timeout);
                            m.slots[i] = Slot::Leased { lease, count, expires };
                            ReceiptOutcome::Extended { expires_ms: expires }
                        }
                    };
                    prop_assert_eq!(got, vec![want]);
                }
                Op::Advance(ms) => {
                    h.clock += ms;
                    h.ok(Command::Tick);
                    m.expire(h.clock);
                }
            }

            // Invariants, after every entry.
            let sub = h.sub().clone();
            prop_assert_eq!(sub.cursor, m.cursor(), "cursor is the ack floor");
            for (i, slot) in m.slots.iter().enumerate() {
                let o = i as u64;
                match slot {
                    Slot::Done => prop_assert!(o < sub.cursor || sub.done.contains(o)),
                    Slot::Leased { lease, .. } => {
                        prop_assert!(o >= sub.cursor, "cursor above a leased offset");
                        prop_assert_eq!(sub.leases.get(&o).map(|l| l.lease_id), Some(*lease));
                    }
                    Slot::Pending { .. } => prop_assert!(sub.pending.contains_key(&o) && o >= sub.cursor),
                    Slot::Fresh => prop_assert!(o >= sub.next_fresh, "fresh offset {o} below next_fresh"),
                }
            }
            // Nothing lost: every offset is accounted for exactly once.
            let leased = sub.leases.len() as u64;
            let pending = sub.pending.len() as u64;
            let fresh = published - sub.next_fresh;
            prop_assert_eq!(sub.cursor + sub.done.len() + leased + pending + fresh, published);
            prop_assert_eq!(sub.backlog(published), pending + fresh);
        }

        // Dead letters: each exactly once in the dead-letter topic, with its origin.
        let dlq_id = h.state.topics["dlq"].id;
        let dead: Vec<(u64, String, u32)> = h
            .records
            .0
            .range((dlq_id, 0)..(dlq_id + 1, 0))
            .map(|(_, r)| {
                let header = |k: &str| r.headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
                prop_assert_eq!(header("raftq-dead-letter-topic"), "t");
                prop_assert_eq!(header("raftq-dead-letter-subscription"), "s");
                let offset: u64 = header("raftq-dead-letter-offset").parse().unwrap_or(u64::MAX);
                prop_assert_eq!(r.value.clone(), format!("v{offset}").into_bytes(), "the original value");
                prop_assert_eq!(header("h"), format!("v{offset}"), "the original headers");
                Ok((offset, header("raftq-dead-letter-reason"), header("raftq-dead-letter-delivery-count").parse().unwrap_or(0)))
            })
            .collect::<Result<_, TestCaseError>>()?;
        let want: Vec<(u64, String, u32)> = m.dead.iter().map(|(o, r, c)| (*o, r.to_string(), *c)).collect();
        prop_assert_eq!(dead, want);
        prop_assert_eq!(h.sub().counters.dead_lettered, m.dead.len() as u64);
    }
}

#[test]
fn create_subscription_table() {
    let mut h = Harness::new();
    h.topic("t");
    h.topic("dlq");
    h.publish("t", &["a", "b", "c"]);
    let create = |name: &str, s: SubSettings| {
        Command::CreateSubscription(CreateSub {
            topic: "t".into(),
            name: name.into(),
            settings: s,
        })
    };
    let base = settings(1000, None, None);
    let cases: Vec<(Command, CommandResult)> = vec![
        (create("s", base.clone()), Ok(Outcome::SubscriptionCreated)),
        (create("s", base.clone()), Ok(Outcome::SubscriptionExists)),
        (
            create("s", settings(2000, None, None)),
            Err(ApplyError::AlreadyExists("t/s".into())),
        ),
        (
            Command::CreateSubscription(CreateSub {
                topic: "nope".into(),
                name: "s".into(),
                settings: base.clone(),
            }),
            Err(ApplyError::TopicNotFound("nope".into())),
        ),
        (
            create("bad name", base.clone()),
            Err(ApplyError::InvalidArgument(
                "invalid subscription name \"bad name\"".into(),
            )),
        ),
        (
            create("z", settings(0, None, None)),
            Err(ApplyError::InvalidArgument(
                "ack_timeout_ms must be between 1 and 43200000, not 0".into(),
            )),
        ),
        (
            create("z", settings(10, Some(0), None)),
            Err(ApplyError::InvalidArgument(
                "max_deliveries must be at least 1 (omit it for no limit)".into(),
            )),
        ),
        (
            create("z", settings(10, None, Some("t"))),
            Err(ApplyError::InvalidArgument(
                "dead_letter_topic must be another topic than the subscription's own".into(),
            )),
        ),
        (
            create("z", settings(10, None, Some("missing"))),
            Err(ApplyError::InvalidArgument(
                "dead_letter_topic \"missing\" does not exist; create it first".into(),
            )),
        ),
        (
            create(
                "z",
                SubSettings {
                    start: Start::Offset(4),
                    ..base.clone()
                },
            ),
            Err(ApplyError::InvalidArgument(
                "start offset 4 is outside the topic's offsets 0..=3".into(),
            )),
        ),
        (
            create(
                "n",
                SubSettings {
                    start: Start::Next,
                    ..base.clone()
                },
            ),
            Ok(Outcome::SubscriptionCreated),
        ),
        (
            create(
                "o",
                SubSettings {
                    start: Start::Offset(2),
                    ..base.clone()
                },
            ),
            Ok(Outcome::SubscriptionCreated),
        ),
    ];
    for (i, (cmd, want)) in cases.into_iter().enumerate() {
        let before = h.state.clone();
        let got = h.run(cmd);
        assert_eq!(got, want, "case {i}");
        if got.is_err() || got == Ok(Outcome::SubscriptionExists) {
            assert_eq!(h.state.subs, before.subs, "case {i}: nothing changed");
        }
    }
    assert_eq!(h.state.sub("t", "s").unwrap().cursor, 0);
    assert_eq!(h.state.sub("t", "n").unwrap().cursor, 3);
    assert_eq!(h.state.sub("t", "o").unwrap().cursor, 2);
    assert_eq!(h.state.subs_of("t").count(), 3);
}

#[test]
fn commands_on_a_missing_subscription_are_refused() {
    let mut h = Harness::new();
    h.topic("t");
    let missing = Err(ApplyError::SubscriptionNotFound("t".into(), "s".into()));
    assert_eq!(
        h.run(Command::Pull(Pull {
            sub: sref(),
            max: 1,
            ack_timeout_ms: None
        })),
        missing
    );
    assert_eq!(
        h.run(Command::SettleReceipts(SettleReceipts {
            sub: sref(),
            action: ReceiptAction::Ack,
            receipts: vec![]
        })),
        missing
    );
    assert_eq!(h.run(Command::DeleteSubscription(sref())), missing);
    let no_topic = SubRef {
        topic: "nope".into(),
        name: "s".into(),
    };
    assert_eq!(
        h.run(Command::Pull(Pull {
            sub: no_topic,
            max: 1,
            ack_timeout_ms: None
        })),
        Err(ApplyError::TopicNotFound("nope".into())),
        "a missing topic is named as such"
    );
}

#[test]
fn expired_lease_comes_back_first_and_its_old_receipt_works_until_redelivered() {
    let mut h = Harness::new();
    h.topic("t");
    h.publish("t", &["a", "b", "c", "d", "e"]);
    h.subscribe("t", "s", settings(100, None, None));
    let first = h.pull(5, None);
    // Ack three, not the lowest: the cursor stays at 0.
    let acks: Vec<Receipt> = first[2..].iter().map(|d| d.receipt).collect();
    assert_eq!(
        h.settle(ReceiptAction::Ack, acks),
        vec![ReceiptOutcome::Acked; 3]
    );
    assert_eq!(h.sub().cursor, 0);
    assert_eq!(h.state.next_due(), Some(1100));
    // Time passes by the entry clock only.
    h.clock += 100;
    h.ok(Command::Tick);
    assert_eq!(h.sub().counters.expired_leases, 2);
    assert!(h.sub().leases.is_empty());
    // Offset 1's old receipt still names the last delivery: it can be acked.
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![first[1].receipt]),
        vec![ReceiptOutcome::Acked]
    );
    h.publish("t", &["f"]);
    let again = h.pull(5, None);
    let offsets: Vec<(u64, u32)> = again
        .iter()
        .map(|d| (d.receipt.offset, d.delivery_count))
        .collect();
    assert_eq!(
        offsets,
        vec![(0, 2), (5, 1)],
        "the expired record first, at its offset"
    );
    // Redelivered: the first receipt of offset 0 is stale now.
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![first[0].receipt]),
        vec![ReceiptOutcome::Stale]
    );
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![again[0].receipt]),
        vec![ReceiptOutcome::Acked]
    );
    assert_eq!(h.sub().cursor, 5);
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![again[0].receipt]),
        vec![ReceiptOutcome::Stale],
        "no double ack"
    );
}

#[test]
fn nack_delay_holds_a_record_back_then_it_comes_first() {
    let mut h = Harness::new();
    h.topic("t");
    h.publish("t", &["a", "b"]);
    h.subscribe("t", "s", settings(10_000, None, None));
    let d = h.pull(1, None);
    let got = h.settle(
        ReceiptAction::Nack {
            delay_ms: 500,
            dead_letter: false,
        },
        vec![d[0].receipt],
    );
    assert_eq!(got, vec![ReceiptOutcome::Released]);
    // The consumer gave it up: its receipt no longer extends, acks or nacks it.
    for action in [
        ReceiptAction::Extend {
            ack_timeout_ms: None,
        },
        ReceiptAction::Ack,
        ReceiptAction::Nack {
            delay_ms: 0,
            dead_letter: false,
        },
    ] {
        assert_eq!(
            h.settle(action, vec![d[0].receipt]),
            vec![ReceiptOutcome::Stale]
        );
    }
    assert_eq!(h.state.next_due(), Some(1500));
    let next = h.pull(5, None);
    assert_eq!(
        next.iter().map(|d| d.receipt.offset).collect::<Vec<_>>(),
        vec![1],
        "held back"
    );
    h.clock += 500;
    let later = h.pull(5, None);
    assert_eq!(
        later
            .iter()
            .map(|d| (d.receipt.offset, d.delivery_count))
            .collect::<Vec<_>>(),
        vec![(0, 2)]
    );
}

#[test]
fn dead_letter_without_a_topic_is_counted_discarded() {
    let mut h = Harness::new();
    h.topic("t");
    h.publish("t", &["a", "b"]);
    h.subscribe("t", "s", settings(100, Some(1), None));
    let d = h.pull(2, None);
    assert_eq!(
        h.dead_letter_now(d[0].receipt),
        vec![ReceiptOutcome::DeadLettered]
    );
    h.clock += 100;
    h.ok(Command::Tick);
    let c = &h.sub().counters;
    assert_eq!(
        (
            c.dead_lettered,
            c.discarded_rejected,
            c.discarded_max_deliveries
        ),
        (0, 1, 1)
    );
    assert_eq!(h.sub().cursor, 2, "discarded records are done");
}

#[test]
fn cursor_moves_forward_backward_and_refuses_the_rest() {
    let mut h = Harness::new();
    h.topic("t");
    h.publish("t", &["a", "b", "c", "d", "e"]);
    h.subscribe("t", "s", settings(10_000, None, None));
    let d = h.pull(3, None);
    let set = |offset, allow_backward, forward_only| {
        Command::SetCursor(SetCursor {
            sub: sref(),
            offset,
            allow_backward,
            forward_only,
        })
    };
    // Forward over leased records: they are forgotten, their receipts stale.
    assert_eq!(h.run(set(2, false, false)), Ok(Outcome::CursorSet(2)));
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![d[0].receipt, d[2].receipt]),
        vec![ReceiptOutcome::Stale, ReceiptOutcome::Acked]
    );
    assert_eq!(h.sub().cursor, 3);
    assert_eq!(
        h.run(set(1, false, true)),
        Ok(Outcome::CursorSet(3)),
        "a read never moves it back"
    );
    assert!(matches!(
        h.run(set(1, false, false)),
        Err(ApplyError::InvalidArgument(_))
    ));
    assert!(matches!(
        h.run(set(6, false, false)),
        Err(ApplyError::InvalidArgument(_))
    ));
    assert_eq!(h.run(set(5, false, false)), Ok(Outcome::CursorSet(5)));
    assert!(h.pull(5, None).is_empty());
    // Backward: a replay from 1.
    assert_eq!(h.run(set(1, true, false)), Ok(Outcome::CursorSet(1)));
    let replay = h.pull(10, None);
    assert_eq!(
        replay.iter().map(|d| d.receipt.offset).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    // Backward over leased records (above the new cursor): every lease is forgotten, with its
    // expiry timer, and its receipt is stale.
    assert_eq!(h.run(set(0, true, false)), Ok(Outcome::CursorSet(0)));
    assert!(h.sub().leases.is_empty(), "{:?}", h.sub().leases);
    assert!(h.state.due.is_empty(), "{:?}", h.state.due);
    assert_eq!(
        h.settle(ReceiptAction::Ack, vec![replay[3].receipt]),
        vec![ReceiptOutcome::Stale]
    );
}

#[test]
fn deleting_a_topic_deletes_its_subscriptions_and_their_timers() {
    let mut h = Harness::new();
    h.topic("t");
    h.publish("t", &["a"]);
    h.subscribe("t", "s", settings(100, None, None));
    h.pull(1, None);
    assert!(h.state.next_due().is_some());
    h.ok(Command::DeleteTopic(DeleteTopic { name: "t".into() }));
    assert!(h.state.subs.is_empty() && h.state.sub_names.is_empty());
    assert_eq!(h.state.next_due(), None);
}

#[test]
fn receipts_parse_strictly() {
    let r = Receipt {
        sub_id: 3,
        offset: 17,
        lease_id: 42,
    };
    assert_eq!(Receipt::parse(&r.to_string()), Some(r));
    for bad in ["", "1.2", "1.2.3.4", "a.b.c", "1..3", "-1.2.3", "1.2.3 "] {
        assert_eq!(Receipt::parse(bad), None, "{bad:?}");
    }
}

/// A record store whose stored records cannot be read (a corrupt block, a failed disk), or
/// are missing: what apply must stop on rather than decide from.
struct Unreadable<'a> {
    records: &'a Records,
    missing: bool,
}

impl RecordSource for Unreadable<'_> {
    fn logged(&self, at: RecordAt, _timestamp_ms: u64) -> Result<StoredRecord, String> {
        Err(format!("entry {} cannot be read", at.index))
    }

    fn stored(&self, topic_id: u64, offset: u64) -> Result<Option<StoredRecord>, ReadFault> {
        if self.missing {
            return Ok(None);
        }
        let _ = self.records;
        Err(ReadFault {
            topic_id,
            offset,
            reason: "checksum mismatch".into(),
        })
    }
}

/// Applies `cmd`, `after_ms` after the harness's clock, against a record store whose reads
/// fail (or find nothing).
fn apply_unreadable(
    h: &mut Harness,
    after_ms: u64,
    cmd: Command,
    missing: bool,
) -> Result<(), ReadFault> {
    let batch = Batch {
        timestamp_ms: h.clock + after_ms,
        commands: vec![cmd],
    };
    let source = Unreadable {
        records: &h.records,
        missing,
    };
    apply_entry(&mut h.state, &source, h.index + 1, &batch, &mut Vec::new()).map(|_| ())
}

/// Every path of apply that reads a stored record stops with a storage fault when the read
/// fails or the record is missing: a dead letter by nack, one by `max_deliveries` on lease
/// expiry, and retention by age. None of them decides anything from the failed read.
#[test]
fn apply_stops_on_a_record_it_cannot_read() {
    for missing in [false, true] {
        let mut h = Harness::new();
        h.topic("t");
        h.topic("dlq");
        h.publish("t", &["a", "b"]);
        h.subscribe("t", "s", settings(100, Some(1), Some("dlq")));
        let d = h.pull(2, None);
        let nack = Command::SettleReceipts(SettleReceipts {
            sub: sref(),
            action: ReceiptAction::Nack {
                delay_ms: 0,
                dead_letter: true,
            },
            receipts: vec![d[0].receipt],
        });
        // A failed apply leaves the state half-applied (the store reloads it): each path is
        // tried on a copy of the same starting point.
        let start = h.state.clone();
        let fault = apply_unreadable(&mut h, 0, nack, missing)
            .expect_err("a dead letter whose record cannot be read");
        assert_eq!((fault.topic_id, fault.offset), (0, 0), "{fault}");
        // Both leases expire at max_deliveries 1: dead-lettered by the next entry.
        h.state = start;
        let fault = apply_unreadable(&mut h, 100, Command::Tick, missing)
            .expect_err("an expiry dead letter whose record cannot be read");
        assert_eq!(fault.offset, 0, "{fault}");

        let mut h = Harness::new();
        h.ok(Command::CreateTopic(CreateTopic {
            name: "aged".into(),
            settings: TopicSettings {
                max_age_ms: Some(1_000),
                ..TopicSettings::default()
            },
        }));
        h.publish("aged", &["old"]);
        let fault = apply_unreadable(&mut h, 5_000, Command::Tick, missing)
            .expect_err("retention by age whose record cannot be read");
        assert_eq!(fault.offset, 0, "{fault}");
    }
    // With readable records the same paths go through.
    let mut h = Harness::new();
    h.topic("t");
    h.topic("dlq");
    h.publish("t", &["a"]);
    h.subscribe("t", "s", settings(100, Some(1), Some("dlq")));
    let d = h.pull(1, None);
    assert_eq!(
        h.dead_letter_now(d[0].receipt),
        vec![ReceiptOutcome::DeadLettered]
    );
}
