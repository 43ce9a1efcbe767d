//! `raftq publish`: lines of a file or stdin as records, through [`raftq_client::Producer`].

use std::io::{self, BufRead, IsTerminal};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raftq_client::api::RecordIn;
use raftq_client::{Delivery, Producer, ProducerError, ProducerOptions, SendError};

use super::{block_on, connect, on_interrupt, Failure, PublishArgs};

/// Lines read ahead of the producer.
const PUBLISH_READ_AHEAD: usize = 4_096;
/// Most lines handed to the producer in one `send_many`.
const PUBLISH_CHUNK: usize = 1_000;
/// How often progress is redrawn on a terminal.
const PROGRESS_TTY: Duration = Duration::from_millis(250);
/// How often a progress line is printed when stderr is not a terminal.
const PROGRESS_PLAIN: Duration = Duration::from_secs(10);
/// Failed records printed one by one; the rest are only counted.
const FAILURES_SHOWN: u64 = 10;

/// One line of input: its number (from 0) and its bytes, without the line end.
struct Line {
    number: u64,
    bytes: Vec<u8>,
}

/// What the collector of deliveries saw (the totals come from the producer's counters).
#[derive(Debug, Default)]
struct Tally {
    /// Records whose outcome is unknown (they may have been appended).
    unknown: u64,
    /// Failures printed so far.
    shown: u64,
}

/// Runs `raftq publish`.
pub fn publish(args: PublishArgs) -> ExitCode {
    block_on(run_publish(args))
}

fn producer_failure(err: ProducerError) -> Failure {
    match err {
        ProducerError::InvalidArgument(text) => Failure::Usage(text),
        other => Failure::Producer(other),
    }
}

pub(crate) async fn run_publish(args: PublishArgs) -> Result<ExitCode, Failure> {
    if args.producer_id.is_some() && args.spool.is_none() {
        return Err(Failure::Usage(
            "--producer-id needs --spool: without a spool a producer starts again at batch \
             sequence 0, and the server would take a new run's records for duplicates of an \
             earlier run's and drop them. Give a --spool directory (it keeps the id and the \
             sequence), or leave out --producer-id"
                .to_string(),
        ));
    }
    if args.key_separator.as_deref() == Some("") {
        return Err(Failure::Usage(
            "--key-separator must not be empty".to_string(),
        ));
    }
    // The input is opened first: a missing file is reported before anything is sent.
    let input: Box<dyn BufRead + Send> = match &args.file {
        Some(path) => match std::fs::File::open(path) {
            Ok(file) => Box::new(io::BufReader::new(file)),
            Err(err) => {
                return Err(Failure::Usage(format!(
                    "cannot read {}: {err}",
                    path.display()
                )))
            }
        },
        None => Box::new(io::BufReader::new(io::stdin())),
    };
    let client = connect(&args.connection)?;
    // A missing topic is one clear error, rather than one refusal per batch.
    client.topic(&args.topic).await?;
    let mut options = ProducerOptions::new()
        .max_batch_records(args.batch)
        .linger(Duration::from_millis(args.linger_ms))
        .max_in_flight(args.in_flight)
        .buffer_records(args.buffer);
    if let Some(dir) = &args.spool {
        options = options.spool(dir.clone());
    }
    if let Some(id) = &args.producer_id {
        options = options.producer_id(id.clone());
    }
    let producer = Producer::open(client, &args.topic, options)
        .await
        .map_err(producer_failure)?;

    // With a spool and a file, line i is the record with local sequence i: the lines the
    // spool has accepted are skipped.
    let resumable = args.file.is_some() && args.spool.is_some();
    let skip = if resumable {
        producer.next_local_sequence()
    } else {
        0
    };
    let recovered = producer.recovered().clone();
    if recovered.records > 0 {
        eprintln!(
            "raftq: re-sending {} records that the spool held from an earlier run",
            recovered.records
        );
    }
    if skip > 0 {
        eprintln!("raftq: resuming: skipping the first {skip} lines, accepted by an earlier run");
    }
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::channel(PUBLISH_READ_AHEAD);
    std::thread::spawn(move || read_lines(input, skip, lines_tx));

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    on_interrupt(move || {
        let _ = stop_tx.send(true);
    });
    let tty = io::stderr().is_terminal();
    let started = Instant::now();
    let progress = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(if tty { PROGRESS_TTY } else { PROGRESS_PLAIN });
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let done = producer.stats().committed;
                let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
                if tty {
                    eprint!("\r\x1b[2Kraftq: {done} published ({rate:.0}/s)");
                } else {
                    eprintln!("raftq: {done} published ({rate:.0}/s)");
                }
            }
        })
    };
    let (outcomes_tx, mut outcomes_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Delivery)>();
    // Set when an interrupted run with a spool stops: its unsettled records are not failures,
    // they wait in the spool for the next run.
    let kept_in_spool = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let quiet = kept_in_spool.clone();
    let collector = tokio::spawn(async move {
        let mut tally = Tally::default();
        while let Some((number, delivery)) = outcomes_rx.recv().await {
            let failure = match delivery.await {
                Ok(_) | Err(SendError::OffsetUnknown) => continue,
                Err(err) => err,
            };
            if matches!(failure, SendError::Indeterminate { .. }) {
                tally.unknown += 1;
            }
            let kept = quiet.load(Ordering::SeqCst) && !matches!(failure, SendError::Refused(_));
            if tally.shown < FAILURES_SHOWN && !kept {
                tally.shown += 1;
                let clear = if tty { "\r\x1b[2K" } else { "" };
                eprintln!("{clear}raftq: line {}: {failure}", number + 1);
            }
        }
        tally
    });

    let mut interrupted = false;
    let mut stopped: Option<ProducerError> = None;
    let mut input_error: Option<String> = None;
    'input: loop {
        let first = tokio::select! {
            line = lines_rx.recv() => line,
            Ok(()) = stop_rx.changed() => {
                interrupted = true;
                break;
            }
        };
        let Some(first) = first else { break };
        let mut chunk = vec![first];
        while chunk.len() < PUBLISH_CHUNK {
            match lines_rx.try_recv() {
                Ok(line) => chunk.push(line),
                Err(_) => break,
            }
        }
        let mut numbers = Vec::with_capacity(chunk.len());
        let mut records = Vec::with_capacity(chunk.len());
        for line in chunk {
            match line {
                Ok(line) => {
                    numbers.push(line.number);
                    records.push(record_of(
                        line.bytes,
                        args.key.as_deref(),
                        args.key_separator.as_deref(),
                    ));
                }
                Err(text) => {
                    input_error = Some(text);
                    break;
                }
            }
        }
        if !records.is_empty() {
            let sent = tokio::select! {
                sent = producer.send_many(records) => sent,
                Ok(()) = stop_rx.changed() => {
                    interrupted = true;
                    break;
                }
            };
            match sent {
                Ok(deliveries) => {
                    for (number, delivery) in numbers.into_iter().zip(deliveries) {
                        if resumable && delivery.local_sequence() != number {
                            stopped = Some(ProducerError::Desynchronized {
                                detail: format!(
                                    "line {} got local sequence {}: the spool does not match \
                                     the file",
                                    number + 1,
                                    delivery.local_sequence()
                                ),
                            });
                            break 'input;
                        }
                        let _ = outcomes_tx.send((number, delivery));
                    }
                }
                Err(err) => {
                    stopped = Some(err);
                    break;
                }
            }
        }
        if input_error.is_some() {
            break;
        }
    }
    drop(lines_rx);

    let end = if interrupted && args.spool.is_some() {
        kept_in_spool.store(true, Ordering::SeqCst);
        producer.abort().await;
        Ok(())
    } else {
        if interrupted {
            eprintln!(
                "raftq: interrupted: waiting for the outcome of what was sent (Ctrl-C again to \
                 quit at once)"
            );
        }
        producer.close().await
    };
    if let Err(err) = end {
        stopped.get_or_insert(err);
    }
    drop(outcomes_tx);
    let tally = collector.await.unwrap_or_default();
    progress.abort();

    let elapsed = started.elapsed().as_secs_f64();
    let stats = producer.stats();
    if tty {
        eprint!("\r\x1b[2K");
    }
    // The producer's counters, not the tally: records accepted by a `send_many` cut short by
    // Ctrl-C have their outcome too, without a delivery anyone awaited.
    let mut summary = format!(
        "raftq: {} records published to {} in {elapsed:.1} s ({:.0}/s)",
        stats.committed,
        args.topic,
        stats.committed as f64 / elapsed.max(0.001)
    );
    if recovered.records > 0 {
        summary.push_str(&format!(
            ", {} of them from the spool of an earlier run",
            recovered.records.min(stats.committed)
        ));
    }
    if stats.duplicates > 0 {
        summary.push_str(&format!(
            "; {} were already in the topic (a batch sent again after a lost answer or a \
             restart) and were not appended twice",
            stats.duplicates
        ));
    }
    eprintln!("{summary}");
    if stats.refused > 0 {
        eprintln!("raftq: {} records refused (not appended)", stats.refused);
    }
    if stats.unsettled > 0 && !kept_in_spool.load(Ordering::SeqCst) {
        eprintln!(
            "raftq: {} records have no outcome: the producer stopped before their batches were \
             settled ({} of them may have been appended, as listed above)",
            stats.unsettled, tally.unknown
        );
    }
    let failed = stats.refused + stats.unsettled;
    if let Some(text) = &input_error {
        eprintln!("raftq: {text}");
    }
    if let Some(err) = &stopped {
        eprintln!("raftq: {err}");
    }
    // Accepted (into the spool) and not settled: counted by the producer, since records
    // accepted by a `send_many` cut short by Ctrl-C never reached the tally.
    let unsettled =
        (recovered.records + stats.accepted).saturating_sub(stats.committed + stats.refused);
    let spool_note = |what: &str| {
        if let Some(dir) = &args.spool {
            eprintln!(
                "raftq: {what}: the {unsettled} records accepted and not yet committed stay in the \
                 spool {}; run the same command again to send them{}",
                dir.display(),
                if resumable {
                    " and the rest of the file"
                } else {
                    ""
                }
            );
        }
    };
    if interrupted {
        spool_note("interrupted");
        return Ok(ExitCode::from(130));
    }
    if stopped.is_some() || input_error.is_some() || failed > 0 {
        if stopped.is_some() {
            spool_note("stopped");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads lines (split at `\n`, a `\r` before it dropped), skipping the first `skip`, and
/// hands them over until the receiver is gone. Runs on its own thread: reading stdin blocks.
fn read_lines(
    mut input: Box<dyn BufRead + Send>,
    skip: u64,
    lines: tokio::sync::mpsc::Sender<Result<Line, String>>,
) {
    let mut number = 0u64;
    loop {
        let mut bytes = Vec::new();
        match input.read_until(b'\n', &mut bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) => {
                let _ = lines.blocking_send(Err(format!("cannot read line {}: {err}", number + 1)));
                return;
            }
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if number >= skip && lines.blocking_send(Ok(Line { number, bytes })).is_err() {
            return;
        }
        number += 1;
    }
    if number < skip {
        let _ = lines.blocking_send(Err(format!(
            "the spool has accepted {skip} records but the input has only {number} lines: is it \
             the file the spool was used with?"
        )));
    }
}

/// A line as a record: text when it is UTF-8, binary otherwise; the key from `--key` or
/// split off at `--key-separator`.
fn record_of(bytes: Vec<u8>, key: Option<&str>, separator: Option<&str>) -> RecordIn {
    let (key, value) = match separator {
        Some(separator) => {
            let sep = separator.as_bytes();
            match bytes.windows(sep.len()).position(|window| window == sep) {
                Some(at) => (
                    Some(String::from_utf8_lossy(&bytes[..at]).into_owned()),
                    bytes[at + sep.len()..].to_vec(),
                ),
                None => (None, bytes),
            }
        }
        None => (key.map(str::to_string), bytes),
    };
    let record = match String::from_utf8(value) {
        Ok(text) => RecordIn::text(text),
        Err(err) => RecordIn::binary(err.as_bytes()),
    };
    match key {
        Some(key) => record.with_key(key),
        None => record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_records_with_keys() {
        let plain = record_of(b"hello".to_vec(), None, None);
        assert_eq!(plain, RecordIn::text("hello"));
        let keyed = record_of(b"hello".to_vec(), Some("k"), None);
        assert_eq!(keyed, RecordIn::text("hello").with_key("k"));
        let split = record_of(b"order-17::placed::now".to_vec(), None, Some("::"));
        assert_eq!(split, RecordIn::text("placed::now").with_key("order-17"));
        let unsplit = record_of(b"no separator".to_vec(), None, Some("::"));
        assert_eq!(unsplit, RecordIn::text("no separator"));
        let binary = record_of(vec![0xff, 0x00], None, None);
        assert_eq!(binary, RecordIn::binary(&[0xff, 0x00]));
    }

    #[test]
    fn lines_are_read_after_the_skipped_ones() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let input: Box<dyn BufRead + Send> = Box::new(io::Cursor::new(b"a\nb\r\nc\n\nd".to_vec()));
        read_lines(input, 1, tx);
        let mut got = Vec::new();
        while let Ok(line) = rx.try_recv() {
            let line = line.unwrap();
            got.push((line.number, String::from_utf8(line.bytes).unwrap()));
        }
        let expected: Vec<(u64, String)> = [(1, "b"), (2, "c"), (3, ""), (4, "d")]
            .map(|(n, s)| (n, s.to_string()))
            .to_vec();
        assert_eq!(got, expected);

        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        read_lines(Box::new(io::Cursor::new(b"a\n".to_vec())), 5, tx);
        let err = rx.try_recv().unwrap().err().unwrap();
        assert!(err.contains("only 1 lines"), "{err}");
    }
}
