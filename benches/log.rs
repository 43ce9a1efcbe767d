//! The Raft log's write path, as it is and as it is moving to: one entry of 64 records of 1 KiB
//! appended and made durable, through RocksDB's `log` family (a write into the WAL and the
//! memtable, then a WAL fsync, as `LogStore` does; the memtable is flushed to a table file
//! later) and through `store::segments` (an append to a segment file, then an fdatasync).
//!
//!     cargo bench --bench log
//!
//! Before the timed runs it prints, for 2,000 entries each way, the bytes this process wrote to
//! disk per record (`/proc/self/io`, the RocksDB run including the flush of what it wrote) and
//! the CPU time per record (`/proc/self/stat`, every thread).

use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use raftq::store::segments::{SegmentLog, DEFAULT_SEGMENT_BYTES};
use raftq::store::{open_db, write_options, CF_LOG};
use rocksdb::DB;

const RECORDS: usize = 64;
const ENTRY_BYTES: usize = RECORDS * 1024;

fn entry(index: u64) -> Vec<u8> {
    (0..ENTRY_BYTES)
        .map(|i| (index as usize * 31 + i * 7) as u8)
        .collect()
}

fn rocksdb_append(db: &DB, index: u64, value: &[u8]) {
    let cf = db.cf_handle(CF_LOG).expect("log family");
    db.put_cf_opt(cf, index.to_be_bytes(), value, &write_options(false))
        .expect("put");
    db.flush_wal(true).expect("fsync the WAL");
}

fn segments_append(log: &mut SegmentLog, index: u64, value: &[u8]) {
    log.append(index, value).expect("append");
    log.sync().expect("fdatasync");
}

/// (bytes written to disk, CPU ticks) of this process so far.
fn io_and_cpu() -> (u64, u64) {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let written = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    (written, ticks)
}

fn report(what: &str, entries: u64, run: impl FnOnce()) {
    let (w0, c0) = io_and_cpu();
    run();
    let (w1, c1) = io_and_cpu();
    let records = entries * RECORDS as u64;
    let tick_us = 1e6 / 100.0;
    println!(
        "{what}: {:.0} bytes written and {:.1} µs of CPU per 1 KiB record",
        (w1 - w0) as f64 / records as f64,
        (c1 - c0) as f64 * tick_us / records as f64
    );
}

fn measure_once(dir: &Path) {
    const N: u64 = 2_000;
    let values: Vec<Vec<u8>> = (0..8).map(entry).collect();
    let db = open_db(&dir.join("once-db")).expect("open");
    report(
        "rocksdb log family (WAL, then the memtable flushed)",
        N,
        || {
            for i in 1..=N {
                rocksdb_append(&db, i, &values[i as usize % 8]);
            }
            db.flush_cf(db.cf_handle(CF_LOG).expect("log family"))
                .expect("flush");
        },
    );
    drop(db);
    let (mut log, _) =
        SegmentLog::open(&dir.join("once-seg"), 0, DEFAULT_SEGMENT_BYTES).expect("open");
    report("segment files", N, || {
        for i in 1..=N {
            segments_append(&mut log, i, &values[i as usize % 8]);
        }
    });
}

fn append_durably(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::var_os("RAFTQ_BENCH_DIR").unwrap_or(".".into()))
        .expect("tempdir");
    measure_once(dir.path());
    let value = entry(1);
    let mut group = c.benchmark_group("log/append_64x1KiB_durably");
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.measurement_time(Duration::from_secs(5));

    let db = open_db(&dir.path().join("db")).expect("open");
    let mut index = 0u64;
    group.bench_function("rocksdb", |b| {
        b.iter(|| {
            index += 1;
            rocksdb_append(&db, index, &value);
        })
    });
    let (mut log, _) =
        SegmentLog::open(&dir.path().join("seg"), 0, DEFAULT_SEGMENT_BYTES).expect("open");
    let mut index = 0u64;
    group.bench_function("segments", |b| {
        b.iter(|| {
            index += 1;
            segments_append(&mut log, index, &value);
        })
    });
    group.finish();
}

criterion_group!(benches, append_durably);
criterion_main!(benches);
