use super::*;

fn records(values: &[&str]) -> Arc<Vec<RecordIn>> {
    Arc::new(values.iter().map(|v| RecordIn::text(*v)).collect())
}

fn open(dir: &Path) -> Spool {
    Spool::open(dir, "t", None, || "p-test".to_string()).expect("open spool")
}

#[test]
fn replay_rebuilds_pending_batches_and_sequences() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = open(dir.path());
        assert_eq!(spool.producer_id(), "p-test");
        spool
            .write(&[
                Op::Batch {
                    first: 0,
                    seq: 0,
                    records: records(&["a", "b"]),
                },
                Op::Batch {
                    first: 2,
                    seq: 1,
                    records: records(&["c"]),
                },
                Op::Batch {
                    first: 3,
                    seq: 2,
                    records: records(&["d"]),
                },
            ])
            .unwrap();
        spool.write(&[Op::Done(vec![0])]).unwrap();
        // Batch 1 (first 2) refused: batch 2 (first 3) takes its sequence.
        spool
            .write(&[Op::Reseq {
                dropped: vec![2],
                seqs: vec![(3, 1)],
                next_seq: 2,
            }])
            .unwrap();
    }
    let spool = open(dir.path());
    assert_eq!((spool.next_seq(), spool.next_local()), (2, 4));
    let pending: Vec<(u64, u64, usize)> = spool
        .pending()
        .iter()
        .map(|(first, b)| (*first, b.seq, b.records.len()))
        .collect();
    assert_eq!(pending, vec![(3, 1, 1)]);
}

#[test]
fn compaction_keeps_position_and_pending() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = open(dir.path());
        for i in 0..10u64 {
            spool
                .write(&[Op::Batch {
                    first: i,
                    seq: i,
                    records: records(&["x"]),
                }])
                .unwrap();
        }
        spool.write(&[Op::Done((0..9).collect())]).unwrap();
        let before = spool.size();
        spool.rewrite().unwrap();
        assert!(spool.size() < before);
        spool.write(&[Op::Done(vec![9])]).unwrap();
        spool.compact().unwrap();
    }
    let spool = open(dir.path());
    assert!(spool.pending().is_empty());
    assert_eq!((spool.next_seq(), spool.next_local()), (10, 10));
}

#[test]
fn corruption_in_the_middle_is_refused_but_a_torn_tail_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut ends = Vec::new();
    {
        let mut spool = open(dir.path());
        ends.push(spool.size());
        for i in 0..3u64 {
            spool
                .write(&[Op::Batch {
                    first: i,
                    seq: i,
                    records: records(&["value"]),
                }])
                .unwrap();
            ends.push(spool.size());
        }
    }
    let path = dir.path().join(SPOOL_FILE);
    let good = fs::read(&path).unwrap();
    assert_eq!(good.len() as u64, ends[3]);

    // A zero-filled tail (a crash that extended the file but lost its data) is torn.
    let mut zeros = good.clone();
    zeros.extend_from_slice(&[0; 100]);
    fs::write(&path, &zeros).unwrap();
    assert_eq!(open(dir.path()).pending().len(), 3);
    assert_eq!(fs::read(&path).unwrap(), good);

    // The last frame cut short is torn: the first two batches survive.
    fs::write(&path, &good[..good.len() - 5]).unwrap();
    assert_eq!(open(dir.path()).pending().len(), 2);
    assert_eq!(fs::read(&path).unwrap().len() as u64, ends[2]);

    // A flipped byte inside the second batch, with the third after it, is corruption.
    let mut flipped = good.clone();
    let middle = ((ends[1] + ends[2]) / 2) as usize;
    flipped[middle] ^= 0x55;
    fs::write(&path, &flipped).unwrap();
    let err = Spool::open(dir.path(), "t", None, || "x".into()).unwrap_err();
    assert!(
        matches!(&err, ProducerError::Spool { detail, .. } if detail.contains("corrupt")),
        "{err}"
    );
}
