use rocksdb::WriteBatch;

use super::*;
use crate::state::subscriptions::Start;

fn open() -> (tempfile::TempDir, std::sync::Arc<DB>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = super::super::open_db(dir.path()).expect("open");
    (dir, db)
}

/// Subscription `id` of topic `t` with `leases` leases from offset 100 and two pending
/// redeliveries below them, every one of them recorded as changed (as apply leaves them).
fn sample(id: u64, leases: u64) -> SubState {
    let mut sub = SubState {
        id,
        topic: "t".into(),
        name: format!("s{id}"),
        settings: SubSettings {
            start: Start::First,
            ack_timeout_ms: 30_000,
            max_deliveries: Some(5),
            dead_letter_topic: Some("dead".into()),
        },
        origin: 0,
        cursor: 10,
        next_fresh: 100 + leases,
        done: RangeSet::default(),
        leases: Default::default(),
        pending: Default::default(),
        next_lease_id: 7 + leases,
        counters: SubCounters {
            delivered: leases + 9,
            acked: 3,
            ..Default::default()
        },
    };
    sub.done.insert(12);
    sub.done.insert(13);
    for i in 0..leases {
        sub.leases.insert(
            100 + i,
            Lease {
                lease_id: 7 + i,
                delivery_count: 1,
                expires_ms: 50_000 + i,
            },
        );
    }
    for offset in [11, 14] {
        sub.pending.insert(
            offset,
            Pending {
                delivery_count: 2,
                not_before_ms: 40_000,
                last_lease_id: Some(offset),
            },
        );
    }
    sub
}

fn store(db: &DB, sub: &mut SubState) -> WriteBatch {
    let mut batch = WriteBatch::default();
    put(&mut batch, db.cf_handle(CF_SM).expect("cf"), sub).expect("encode");
    batch
}

fn write(db: &DB, batch: WriteBatch) {
    db.write(batch).expect("write");
}

/// Every pair of the `sm` family, in key order.
fn pairs(db: &DB) -> Vec<(Vec<u8>, Vec<u8>)> {
    let cf = db.cf_handle(CF_SM).expect("cf");
    db.iterator_cf(cf, IteratorMode::Start)
        .map(|i| i.map(|(k, v)| (k.to_vec(), v.to_vec())).expect("read"))
        .filter(|(k, _)| k.first() == Some(&keys::SUB_PREFIX))
        .collect()
}

#[test]
fn subscriptions_read_back_as_they_were_stored() {
    let (_dir, db) = open();
    let mut subs = vec![sample(1, 3), sample(2, 0), sample(3, 40)];
    for sub in &mut subs {
        let batch = store(&db, sub);
        write(&db, batch);
        assert!(
            sub.leases.changed().is_empty(),
            "the store took the changes"
        );
    }
    assert_eq!(load(&db).expect("load"), subs);
}

/// The promise deltas keep: an ack writes the head and the one block of leases it changed,
/// byte for byte the same with 10,000 leases in flight as with 256 (it used to write the
/// whole subscription, every lease in it).
#[test]
fn an_ack_writes_the_head_and_one_block_whatever_the_leases_in_flight() {
    let (_dir, db) = open();
    let mut ack_bytes = Vec::new();
    for leases in [256, 10_000] {
        let mut sub = sample(4, leases);
        let batch = store(&db, &mut sub);
        // Leases on offsets 100 to 99 + leases: blocks from 64; both pending in block 0.
        let blocks = (99 + leases) / BLOCK_OFFSETS - 1 + 1;
        assert_eq!(
            batch.len() as u64,
            1 + blocks + 1,
            "first write: head, blocks of leases, block of pending"
        );
        write(&db, batch);
        sub.leases.remove(&200);
        sub.done.insert(200);
        sub.counters.acked += 1;
        let batch = store(&db, &mut sub);
        assert_eq!(batch.len(), 2, "the head and the ended lease's block");
        ack_bytes.push(batch.size_in_bytes());
        write(&db, batch);
        assert_eq!(load(&db).expect("load"), vec![sub]);
    }
    assert_eq!(
        ack_bytes[0], ack_bytes[1],
        "an ack with 10,000 leases in flight wrote more than with 256"
    );
    assert!(ack_bytes[1] < 4096, "an ack wrote {} bytes", ack_bytes[1]);

    let mut sub = sample(4, 10_000);
    write(&db, store(&db, &mut sub));

    sub.leases.insert(
        10_500,
        Lease {
            lease_id: 99_999,
            delivery_count: 1,
            expires_ms: 1,
        },
    );
    sub.pending.remove(&11);
    let batch = store(&db, &mut sub);
    assert_eq!(
        batch.len(),
        3,
        "the head, the new lease's block, the ended redelivery's block"
    );
    write(&db, batch);
    assert_eq!(load(&db).expect("load"), vec![sub.clone()]);

    // A pull of 64 fresh records across a block boundary, then the ack of every one: two
    // blocks each time, the second time deleted (nothing left in them).
    for offset in 20_000..20_064 {
        sub.leases.insert(
            offset,
            Lease {
                lease_id: offset,
                delivery_count: 1,
                expires_ms: 9,
            },
        );
    }
    let batch = store(&db, &mut sub);
    assert_eq!(batch.len(), 3, "the head and two blocks for 64 leases");
    write(&db, batch);
    for offset in 20_000..20_064 {
        sub.leases.remove(&offset);
    }
    let batch = store(&db, &mut sub);
    assert_eq!(batch.len(), 3, "the head and two blocks deleted");
    write(&db, batch);
    assert_eq!(load(&db).expect("load"), vec![sub]);
    let emptied = [lease_block_key(4, 20_000), lease_block_key(4, 20_063)];
    assert!(
        pairs(&db)
            .iter()
            .all(|(k, _)| emptied.iter().all(|e| e[..] != k[..])),
        "an emptied block is left behind"
    );
}

#[test]
fn deleting_a_subscription_removes_every_piece_and_nothing_else() {
    let (_dir, db) = open();
    let mut subs = vec![sample(5, 3), sample(6, 5), sample(7, 2)];
    for sub in &mut subs {
        let batch = store(&db, sub);
        write(&db, batch);
    }
    let (start, end) = range(6);
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(db.cf_handle(CF_SM).expect("cf"), start, end);
    write(&db, batch);
    subs.remove(1);
    assert_eq!(load(&db).expect("load"), subs);
    assert_eq!(range(u64::MAX).1, vec![keys::SUB_PREFIX + 1]);
}

/// A store of data directory format 3 (each subscription one whole value) is split once, at
/// open; what it reads back is the same.
#[test]
fn whole_subscriptions_are_split_once_at_open() {
    let (_dir, db) = open();
    let subs = vec![sample(8, 4), sample(9, 0)];
    let cf = db.cf_handle(CF_SM).expect("cf");
    for sub in &subs {
        db.put_cf(cf, keys::sub(sub.id), values::encode(sub).expect("enc"))
            .expect("put");
    }
    assert_eq!(load(&db).expect("whole values read too"), subs);
    assert_eq!(upgrade(&db).expect("upgrade"), 2);
    let stored = pairs(&db);
    assert_eq!(
        stored.len(),
        2 + 1 + 2,
        "two heads, one block of leases, two of pending"
    );
    assert!(stored
        .iter()
        .filter(|(k, _)| k.len() == 9)
        .all(|(_, v)| v[0] == HEAD_FORMAT));
    assert_eq!(load(&db).expect("load"), subs);
    assert_eq!(upgrade(&db).expect("again"), 0, "the upgrade ran twice");
}

/// A store of data directory formats 4 to 9 (one key per lease and per pending redelivery) is
/// rewritten into blocks once, at open; what it reads back is the same, and nothing of the old
/// keys is left.
#[test]
fn one_key_per_offset_is_rewritten_into_blocks_once_at_open() {
    let (_dir, db) = open();
    let subs = vec![sample(30, 200), sample(31, 0), sample(32, 3)];
    let cf = db.cf_handle(CF_SM).expect("cf");
    // Subscription 32 is already in blocks (a directory where an upgrade is not needed for it).
    let mut in_blocks = subs[2].clone();
    write(&db, store(&db, &mut in_blocks));
    for sub in &subs[..2] {
        db.put_cf(cf, keys::sub(sub.id), encode_head(sub).expect("enc"))
            .expect("put");
        for (offset, lease) in &sub.leases {
            let v = values::encode(lease).expect("enc");
            db.put_cf(cf, lease_key(sub.id, *offset), v).expect("put");
        }
        for (offset, p) in &sub.pending {
            let v = values::encode(p).expect("enc");
            db.put_cf(cf, pending_key(sub.id, *offset), v).expect("put");
        }
    }
    let read = |db: &DB| {
        let mut subs = load(db).expect("load");
        subs.sort_by_key(|s| s.id);
        subs
    };
    assert_eq!(read(&db), subs, "one key per offset reads too");
    assert_eq!(upgrade(&db).expect("upgrade"), 2);
    let stored = pairs(&db);
    assert!(
        stored
            .iter()
            .all(|(k, _)| k.len() == 9 || matches!(k[9], b'L' | b'P')),
        "a key of one offset is left"
    );
    // 30: leases 100..=299 in blocks 64 to 256 (four), pending in block 0; 31: pending only.
    assert_eq!(stored.len(), 3 + (4 + 1) + 1 + (1 + 1));
    assert_eq!(read(&db), subs);
    assert_eq!(upgrade(&db).expect("again"), 0, "the upgrade ran twice");
}

/// Snapshot files hold whole subscriptions: what [`Whole`] makes of the stored pieces is byte
/// for byte what data directory format 3 stored, and [`split`] takes it apart again into the
/// same pieces; other pairs go through untouched, in order.
#[test]
fn whole_and_split_are_each_others_inverse() {
    let (_dir, db) = open();
    let mut subs = vec![sample(10, 3), sample(11, 0), sample(12, 6)];
    let wholes: Vec<(Vec<u8>, Vec<u8>)> = subs
        .iter()
        .map(|s| (keys::sub(s.id).to_vec(), values::encode(s).expect("enc")))
        .collect();
    for sub in &mut subs {
        let batch = store(&db, sub);
        write(&db, batch);
    }
    let stored = pairs(&db);
    let before = (b"p-before".to_vec(), b"1".to_vec());
    let after = (b"t-after".to_vec(), b"2".to_vec());
    let mut input = vec![before.clone()];
    input.extend(stored.iter().cloned());
    input.push(after.clone());

    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut emit = |k: &[u8], v: &[u8]| -> Result<(), String> {
        out.push((k.to_vec(), v.to_vec()));
        Ok(())
    };
    let mut whole = Whole::default();
    for (k, v) in &input {
        whole.push(k, v, &mut emit).expect("push");
    }
    whole.finish(&mut emit).expect("finish");
    let mut want = vec![before.clone()];
    want.extend(wholes.iter().cloned());
    want.push(after.clone());
    assert_eq!(out, want);

    let mut again = Vec::new();
    for (k, v) in out {
        split(k, v, |k, v| again.push((k, v))).expect("split");
    }
    let mut want = vec![before];
    want.extend(stored);
    want.push(after);
    assert_eq!(again, want);
}

/// Damage is an error, never a panic or a guess: a lease with no subscription before it, a head
/// whose id is not its key's, a key of no known shape.
#[test]
fn pieces_out_of_place_are_refused() {
    let lease = values::encode(&Lease {
        lease_id: 1,
        delivery_count: 1,
        expires_ms: 1,
    })
    .expect("enc");
    let head = encode_head(&sample(20, 0)).expect("enc");
    let one = Lease {
        lease_id: 1,
        delivery_count: 1,
        expires_ms: 1,
    };
    let block = |offsets: &[u64]| {
        let entries: Vec<(u64, Lease)> = offsets.iter().map(|o| (*o, one.clone())).collect();
        values::encode(&entries).expect("enc")
    };
    let pending = Pending {
        delivery_count: 2,
        not_before_ms: 1,
        last_lease_id: None,
    };
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
    let cases: Vec<(&str, Pairs)> = vec![
        (
            "orphan lease",
            vec![(lease_key(20, 5).to_vec(), lease.clone())],
        ),
        (
            "lease of another subscription",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_key(21, 5).to_vec(), lease.clone()),
            ],
        ),
        (
            "head under another id",
            vec![(keys::sub(21).to_vec(), head.clone())],
        ),
        (
            "unknown piece",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (piece_key(20, b'x', 5).to_vec(), lease.clone()),
            ],
        ),
        (
            "short key",
            vec![(keys::sub(20)[..5].to_vec(), head.clone())],
        ),
        (
            "undecodable head",
            vec![(keys::sub(20).to_vec(), vec![HEAD_FORMAT, 0xff])],
        ),
        (
            "unknown format",
            vec![(keys::sub(20).to_vec(), vec![9, 1, 2])],
        ),
        (
            "block of leases out of its range",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_block_key(20, 64).to_vec(), block(&[5])),
            ],
        ),
        (
            "block of pending redeliveries under a key not a block's first offset",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (
                    piece_key(20, b'P', 65).to_vec(),
                    values::encode(&vec![(65u64, pending.clone())]).expect("enc"),
                ),
            ],
        ),
        (
            "empty block",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_block_key(20, 0).to_vec(), block(&[])),
            ],
        ),
        (
            "block out of order",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_block_key(20, 0).to_vec(), block(&[6, 5])),
            ],
        ),
        (
            "offset stored twice",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_block_key(20, 0).to_vec(), block(&[5])),
                (lease_key(20, 5).to_vec(), lease.clone()),
            ],
        ),
        (
            "block of another subscription",
            vec![
                (keys::sub(20).to_vec(), head.clone()),
                (lease_block_key(21, 0).to_vec(), block(&[5])),
            ],
        ),
        (
            "lease after a whole value",
            vec![
                (
                    keys::sub(20).to_vec(),
                    values::encode(&sample(20, 1)).expect("enc"),
                ),
                (lease_key(20, 5).to_vec(), lease.clone()),
            ],
        ),
    ];
    for (what, pairs) in cases {
        let mut asm = Assembler::default();
        let result = pairs
            .iter()
            .try_for_each(|(k, v)| asm.push(k, v).map(|_| ()));
        assert!(result.is_err(), "{what} was accepted");
    }
}
