//! Golden bytes: values that raftq wrote to RocksDB must read back, and write again byte for
//! byte, in every later version. `tests/fixtures/formats.txt` holds bytes from a real cluster's
//! data directory: each line the kind of value and its bytes in hex. The test decodes each with
//! the function the store uses and encodes it again; a change to a stored type that would make
//! old data unreadable (a field added, removed or reordered, a variant renumbered) fails it.
//! Such a change gets a new format version beside the old one, never a changed one
//! (ARCHITECTURE.md, "Boundaries and compatibility").
//!
//! `tests/fixtures/snapshot-format<N>.snap` are snapshot files as nodes wrote them in each
//! snapshot format; `snapshot_files_of_every_format_load_and_build_again_byte_for_byte` holds
//! today's code to reading and loading each. A new snapshot format adds its file.
//!
//! To add kinds after a new format version: run a cluster, write what the new version writes,
//! stop it, and run `RAFTQ_CAPTURE_FORMATS=<node data dir> cargo test --release -p raftq --lib
//! store::formats::capture -- --ignored`, which adds the lines of kinds the file lacks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::sm::SmMeta;
use super::{keys, log, records, sm, subs, values, CF_LOG, CF_RAFT, CF_SM};
use crate::codec;
use crate::raft::{LogId, StoredMembership, Vote};
use crate::state::subscriptions::{Lease, Pending};
use crate::state::{Command, LogPayload, ProducerState, SubState, TopicMeta};

/// Every kind of stored value the fixture must hold.
const KINDS: &[&str] = &[
    "log:membership",
    "log:blank",
    "log:CreateTopic",
    "log:Publish",
    "log:CreateSubscription",
    "log:Pull",
    "log:SettleReceipts",
    "log:SetCursor",
    "log:Tick",
    "log:Broadcast",
    "log:DeleteSubscription",
    "log:DeleteTopic",
    "log:PublishBatch",
    "raft:vote",
    "raft:committed",
    "raft:last_purged",
    "raft:files_purged",
    "sm:applied",
    "sm:membership",
    "sm:state",
    "sm:topic",
    "sm:record",
    "sm:record_at",
    "sm:record_run",
    "sm:subscription",
    "sm:subscription_head",
    "sm:lease",
    "sm:pending",
    "sm:lease_block",
    "sm:pending_block",
    "sm:producer",
    "bare:raft:vote",
    "bare:raft:committed",
    "bare:raft:last_purged",
    "bare:sm:applied",
    "bare:sm:membership",
    "bare:sm:state",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats.txt")
}

/// Decodes `bytes` as the store does for `kind` and encodes the value again. A `bare:` kind is
/// a value as data directory format 2 stored it, without its format byte: it is upgraded as
/// opening the store upgrades it, read, written again, and compared without the format byte.
fn round_trip(kind: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    fn meta<T: serde::Serialize + serde::de::DeserializeOwned>(
        b: &[u8],
    ) -> Result<Vec<u8>, String> {
        let v: T = values::decode(b)?;
        values::encode(&v).map_err(|e| e.to_string())
    }
    if let Some(kind) = kind.strip_prefix("bare:") {
        let again = round_trip(kind, &values::with_format_byte(bytes))?;
        return match again.split_first() {
            Some((&values::META_FORMAT, rest)) => Ok(rest.to_vec()),
            _ => Err(format!(
                "written again without the format byte: {again:02x?}"
            )),
        };
    }
    match kind {
        k if k.starts_with("log:") => {
            let entry = log::decode_entry(bytes).map_err(|e| e.to_string())?;
            log::encode_entry(&entry).map_err(|e| e.to_string())
        }
        "raft:vote" => meta::<Vote>(bytes),
        "raft:committed" | "sm:applied" => meta::<Option<LogId>>(bytes),
        "raft:last_purged" => meta::<LogId>(bytes),
        "raft:files_purged" => meta::<u64>(bytes),
        "sm:membership" => meta::<StoredMembership>(bytes),
        "sm:state" => meta::<SmMeta>(bytes),
        "sm:topic" => meta::<TopicMeta>(bytes),
        "sm:subscription" => meta::<SubState>(bytes),
        "sm:subscription_head" => {
            subs::encode_head(&subs::decode_head(bytes)?).map_err(|e| e.to_string())
        }
        "sm:lease" => meta::<Lease>(bytes),
        "sm:pending" => meta::<Pending>(bytes),
        "sm:lease_block" => meta::<Vec<(u64, Lease)>>(bytes),
        "sm:pending_block" => meta::<Vec<(u64, Pending)>>(bytes),
        "sm:producer" => meta::<ProducerState>(bytes),
        "sm:record" => match records::decode(bytes)? {
            records::Stored::Whole(record) => {
                records::encode_record(&record).map_err(|e| e.to_string())
            }
            _ => Err("a record location, not a whole record".into()),
        },
        "sm:record_at" => match records::decode(bytes)? {
            records::Stored::At(at) => records::encode_at(&at).map_err(|e| e.to_string()),
            _ => Err("not the location of one record".into()),
        },
        "sm:record_run" => match records::decode(bytes)? {
            records::Stored::Run(run) => records::encode_run(&run).map_err(|e| e.to_string()),
            _ => Err("not a run of record locations".into()),
        },
        other => Err(format!("unknown kind {other}")),
    }
}

/// The fixture's lines: kind, bytes.
fn read_fixture() -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(fixture()).expect("tests/fixtures/formats.txt");
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (kind, bytes) = l.split_once(' ').expect("a line is `kind hex`");
            (kind.to_string(), codec::unhex(bytes))
        })
        .collect()
}

#[test]
fn stored_bytes_of_every_kind_read_back_and_write_again_byte_for_byte() {
    let lines = read_fixture();
    let mut failures = Vec::new();
    for (n, (kind, bytes)) in lines.iter().enumerate() {
        match round_trip(kind, bytes) {
            Ok(again) if &again == bytes => {}
            Ok(again) => failures.push(format!(
                "line {n} ({kind}): written again as {} instead of {}",
                codec::hex(&again),
                codec::hex(bytes)
            )),
            Err(e) => failures.push(format!("line {n} ({kind}): cannot be read: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in KINDS {
        assert!(
            lines.iter().any(|(k, _)| k == kind),
            "the fixture has no {kind}"
        );
    }
}

/// The kind of a stored value, from its column family and key (and, for a log entry, what it
/// holds).
fn kind_of(cf: &str, key: &[u8], value: &[u8]) -> Option<String> {
    match cf {
        CF_LOG => {
            let entry = log::decode_entry(value).ok()?;
            Some(match &entry.payload {
                openraft::EntryPayload::Blank => "log:blank".to_string(),
                openraft::EntryPayload::Membership(_) => "log:membership".to_string(),
                openraft::EntryPayload::Normal(LogPayload::V1(batch)) => {
                    format!(
                        "log:{}",
                        batch.commands.first().map_or("empty", command_name)
                    )
                }
            })
        }
        CF_RAFT => match key {
            keys::VOTE => Some("raft:vote".into()),
            keys::COMMITTED => Some("raft:committed".into()),
            keys::LAST_PURGED => Some("raft:last_purged".into()),
            keys::FILES_PURGED => Some("raft:files_purged".into()),
            _ => None,
        },
        CF_SM => match key {
            keys::APPLIED => Some("sm:applied".into()),
            keys::MEMBERSHIP => Some("sm:membership".into()),
            keys::SM_META => Some("sm:state".into()),
            [keys::TOPIC_PREFIX, ..] => Some("sm:topic".into()),
            [keys::RECORD_PREFIX, ..] if value.first() == Some(&records::RECORD_AT_FORMAT) => {
                Some("sm:record_at".into())
            }
            [keys::RECORD_PREFIX, ..] if value.first() == Some(&records::RECORD_RUN_FORMAT) => {
                Some("sm:record_run".into())
            }
            [keys::RECORD_PREFIX, ..] => Some("sm:record".into()),
            [keys::SUB_PREFIX, ..] => Some(
                match (key.len(), key.get(9), value.first()) {
                    (9, _, Some(&subs::HEAD_FORMAT)) => "sm:subscription_head",
                    (9, _, _) => "sm:subscription",
                    (_, Some(b'l'), _) => "sm:lease",
                    (_, Some(b'p'), _) => "sm:pending",
                    (_, Some(b'L'), _) => "sm:lease_block",
                    (_, Some(b'P'), _) => "sm:pending_block",
                    _ => return None,
                }
                .into(),
            ),
            [keys::PRODUCER_PREFIX, ..] => Some("sm:producer".into()),
            _ => None,
        },
        _ => None,
    }
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::CreateTopic(_) => "CreateTopic",
        Command::DeleteTopic(_) => "DeleteTopic",
        Command::Publish(_) => "Publish",
        Command::Tick => "Tick",
        Command::CreateSubscription(_) => "CreateSubscription",
        Command::DeleteSubscription(_) => "DeleteSubscription",
        Command::Pull(_) => "Pull",
        Command::SettleReceipts(_) => "SettleReceipts",
        Command::SetCursor(_) => "SetCursor",
        Command::Broadcast(_) => "Broadcast",
        Command::PublishBatch(_) => "PublishBatch",
    }
}

/// Adds to the fixture, from a stopped node's data directory, up to four values of every kind
/// it lacks.
#[test]
#[ignore = "writes the fixture; run by hand with RAFTQ_CAPTURE_FORMATS=<data dir>"]
fn capture() {
    let dir = std::env::var("RAFTQ_CAPTURE_FORMATS").expect("RAFTQ_CAPTURE_FORMATS=<data dir>");
    let db = rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        Path::new(&dir).join("db"),
        [CF_LOG, CF_RAFT, CF_SM],
        false,
    )
    .expect("open the node's database read-only");
    let have = std::fs::read_to_string(fixture()).unwrap_or_default();
    let mut found: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let mut consider = |cf: &str, key: &[u8], value: &[u8]| {
        let Some(kind) = kind_of(cf, key, value) else {
            return;
        };
        if have.lines().any(|l| l.starts_with(&format!("{kind} "))) {
            return;
        }
        let seen = found.entry(kind).or_default();
        if seen.len() < 4 {
            seen.push(value.to_vec());
        }
    };
    for cf in [CF_LOG, CF_RAFT, CF_SM] {
        let handle = db.cf_handle(cf).expect("column family");
        for item in db.iterator_cf(handle, rocksdb::IteratorMode::Start) {
            let (key, value) = item.expect("read");
            consider(cf, &key, &value);
        }
    }
    // Since data directory format 5 the log's entries are in segment files.
    let (segments, _) = super::segments::SegmentLog::open(
        &Path::new(&dir).join("log"),
        u64::MAX,
        super::segments::DEFAULT_SEGMENT_BYTES,
    )
    .expect("open the node's log");
    if let (Some(first), Some(last)) = (segments.first_index(), segments.last_index()) {
        for index in first..=last {
            let value = segments.read(index).expect("read").expect("an entry");
            consider(CF_LOG, &index.to_be_bytes(), &value);
        }
    }
    let mut out = have;
    for (kind, values) in found {
        for v in values {
            round_trip(&kind, &v).expect("a captured value round-trips");
            out.push_str(&format!("{kind} {}\n", codec::hex(&v)));
        }
    }
    std::fs::write(fixture(), out).expect("write the fixture");
}

/// Snapshot files as raftq wrote them in each snapshot format, taken from real nodes (format 1
/// by a node of data directory format 2; format 2 by today's): each is read (a format 1 file's
/// bare values getting their version byte), every value in it reads back and writes again byte
/// for byte, it loads into a store of today that the state machine opens, and a snapshot built
/// from that store, in today's format, holds the same pairs byte for byte.
#[test]
fn snapshot_files_of_every_format_load_and_build_again_byte_for_byte() {
    use super::snapshot;
    let fixtures = fixture().with_file_name("");
    for (name, format) in [("snapshot-format1.snap", 1), ("snapshot-format2.snap", 2)] {
        let path = fixtures.join(name);
        let bytes = std::fs::read(&path).expect("the snapshot fixture");
        assert_eq!(
            bytes[8..12],
            u32::to_le_bytes(format),
            "{name}: format number"
        );
        let pairs = |path: &Path| {
            let mut pairs = Vec::new();
            let file = std::fs::File::open(path).expect("open the snapshot");
            let meta = snapshot::read(file, |k, v| {
                pairs.push((k, v));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (meta, pairs)
        };
        let (meta, stored) = pairs(&path);
        for (key, value) in &stored {
            let kind = kind_of(CF_SM, key, value)
                .unwrap_or_else(|| panic!("{name}: a value of no known kind at {key:02x?}"));
            assert_eq!(
                round_trip(&kind, value).as_ref(),
                Ok(value),
                "{name}: {kind} does not read back and write again byte for byte"
            );
        }

        let dir = tempfile::tempdir().expect("tempdir");
        let db = super::open_db(&dir.path().join("db")).expect("open db");
        snapshot::load_into(&db, &path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let sm = sm::SmShared::open(db.clone(), dir.path().join("snapshots"))
            .unwrap_or_else(|e| panic!("{name}: the state machine does not open: {e}"));
        {
            let view = sm.view();
            assert_eq!(view.last_applied, meta.last_log_id, "{name}");
            assert_eq!(view.membership, meta.last_membership, "{name}");
            let topics: Vec<&str> = view.state.topics.keys().map(String::as_str).collect();
            assert_eq!(topics, ["orders", "orders.dlq"], "{name}");
        }
        let (built, built_path, _) =
            snapshot::build(&db, &dir.path().join("built"), 1).expect("build a snapshot");
        assert_eq!(built.raft_meta(), meta.raft_meta(), "{name}");
        let again = std::fs::read(&built_path).expect("read the built snapshot");
        assert_eq!(
            again[8..12],
            u32::to_le_bytes(snapshot::FORMAT_VERSION),
            "{name}: built in today's format"
        );
        assert!(
            pairs(&built_path).1 == stored,
            "{name}: the snapshot built from what it loaded holds other pairs"
        );
    }
}
