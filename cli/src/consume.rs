//! `raftq consume` (queue semantics, through [`raftq_client::Subscriber`]) and `raftq tail`
//! (stream semantics, through [`raftq_client::Reader`]).

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftq_client::api::{Message, Record, MAX_PULL};
use raftq_client::{Reader, Subscriber, SubscriberOptions};

use super::{block_on, connect, on_interrupt, ConsumeArgs, Failure, TailArgs};

/// Long-poll wait of `tail -f` reads.
const FOLLOW_WAIT: Duration = Duration::from_secs(10);
/// Most records one `tail` read asks for.
const TAIL_BATCH: u64 = 1_000;
/// How long `tail` tries to commit its last batch to a subscription when it ends.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `raftq consume`.
pub fn consume(args: ConsumeArgs) -> ExitCode {
    block_on(run_consume(args))
}

async fn run_consume(args: ConsumeArgs) -> Result<(), Failure> {
    if args.max == Some(0) {
        return Ok(());
    }
    if args.batch == 0 || args.batch > MAX_PULL {
        return Err(Failure::Usage(format!(
            "--batch is 1 to {MAX_PULL}, not {}",
            args.batch
        )));
    }
    let client = connect(&args.connection)?;
    // Never lease more than are left to print: what is leased and not printed is released at
    // the stop, but would have been held from other consumers meanwhile.
    let batch = match args.max {
        Some(max) => u64::from(args.batch).min(max) as u32,
        None => args.batch,
    };
    let mut options = SubscriberOptions::new().batch(batch);
    if let Some(consumer) = &args.consumer {
        options = options.consumer(consumer.clone());
    }
    let subscriber = Subscriber::new(client, &args.topic, &args.subscription, options)?;
    let stop = subscriber.stop_handle();
    let interrupt = stop.clone();
    on_interrupt(move || interrupt.stop());

    let printed = Arc::new(AtomicU64::new(0));
    let count = printed.clone();
    let (json, max) = (args.json, args.max);
    // One handler at a time (the default concurrency): lines come out in pull order, and a
    // message is acked only after its line was flushed to stdout.
    let result = subscriber
        .run(move |message: Message| {
            let written = print_message(&message, json);
            if written.is_ok() {
                let done = count.fetch_add(1, Ordering::SeqCst) + 1;
                if max.is_some_and(|max| done >= max) {
                    // The subscriber starts no handler after this; the message is still acked.
                    stop.stop();
                }
            } else {
                stop.stop();
            }
            async move { written }
        })
        .await;

    let (report, error) = match result {
        Ok(report) => (report, None),
        Err(err) => (err.report, Some(err.error)),
    };
    eprintln!(
        "raftq: {} consumed: {} acked, {} released for redelivery{}",
        printed.load(Ordering::SeqCst),
        report.acked,
        report.nacked + report.released_on_stop.len() as u64,
        if report.stale > 0 {
            format!(", {} acks found their lease already lost", report.stale)
        } else {
            String::new()
        }
    );
    if !report.unsettled.is_empty() {
        let offsets: Vec<String> = report
            .unsettled
            .iter()
            .map(|(offset, _)| offset.to_string())
            .collect();
        eprintln!(
            "raftq: warning: could not ack or release offsets {}: they will be delivered again \
             when their lease expires",
            offsets.join(", ")
        );
    }
    if let Some(err) = error {
        return Err(err.into());
    }
    if report.failed > 0 {
        // Only output errors fail this handler.
        return Err(Failure::Output(io::Error::other(
            "stdout closed, the message was released",
        )));
    }
    Ok(())
}

fn print_message(message: &Message, json: bool) -> Result<(), io::Error> {
    let line = if json {
        serde_json::to_string(message).map_err(io::Error::other)?
    } else {
        format!(
            "{}\t{}\t{}\t{}",
            message.offset,
            message.delivery_count,
            key_field(message.key.as_deref()),
            value_field(&message.value)
        )
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// Runs `raftq tail`.
pub fn tail(args: TailArgs) -> ExitCode {
    block_on(run_tail(args))
}

async fn run_tail(args: TailArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let mut reader = match &args.subscription {
        Some(subscription) => Reader::new(client, &args.topic, subscription)?,
        None => Reader::for_topic(client, &args.topic)?,
    };
    if let Some(from) = args.from {
        reader = reader.start(from);
    }
    reader = if args.follow {
        // Following rides out failovers, however long: Ctrl-C ends it.
        reader.wait(FOLLOW_WAIT)
    } else {
        // A one-off read gives up when the client's deadline passes without an answer.
        reader.wait(Duration::ZERO).retry_for(Duration::ZERO)
    };

    let interrupted = Arc::new(tokio::sync::Notify::new());
    let notify = interrupted.clone();
    on_interrupt(move || notify.notify_one());

    let mut printed = 0u64;
    let mut out = io::stdout().lock();
    loop {
        let remaining = args.max.map(|max| max.saturating_sub(printed));
        if remaining == Some(0) {
            break;
        }
        // Never read more than is left to print: with a subscription, the whole batch is
        // committed by the next read.
        reader.set_max(Some(remaining.unwrap_or(TAIL_BATCH).min(TAIL_BATCH)));
        let batch = tokio::select! {
            batch = reader.next_batch() => batch?,
            _ = interrupted.notified() => break,
        };
        if batch.skipped > 0 {
            eprintln!(
                "raftq: {} records before offset {} were removed by retention and skipped",
                batch.skipped,
                batch
                    .records
                    .first()
                    .map_or(batch.next_offset, |record| record.offset)
            );
        }
        for record in &batch.records {
            // Stdout failing (a closed pipe) ends the command without committing this batch:
            // it is read again next time.
            print_record(&mut out, record, args.json).map_err(Failure::Output)?;
            printed += 1;
        }
        out.flush().map_err(Failure::Output)?;
        if !args.follow && (batch.records.is_empty() || batch.next_offset >= batch.high_watermark) {
            break;
        }
    }
    drop(out);
    // Commit the last batch printed (with a subscription): the next reader starts after it.
    match tokio::time::timeout(COMMIT_TIMEOUT, reader.commit()).await {
        Ok(result) => result?,
        Err(_) => eprintln!(
            "raftq: warning: could not move the subscription's cursor past the last records \
             printed; they will be read again"
        ),
    }
    Ok(())
}

fn print_record(out: &mut impl Write, record: &Record, json: bool) -> Result<(), io::Error> {
    if json {
        let line = serde_json::to_string(record).map_err(io::Error::other)?;
        writeln!(out, "{line}")
    } else {
        writeln!(
            out,
            "{}\t{}\t{}",
            record.offset,
            key_field(record.key.as_deref()),
            value_field(&record.value)
        )
    }
}

/// A key on one line: `-` when there is none.
fn key_field(key: Option<&str>) -> String {
    key.map_or_else(|| "-".to_string(), escape)
}

/// A value on one line: text escaped, binary as `base64:...`.
fn value_field(value: &[u8]) -> String {
    use base64::Engine as _;
    match std::str::from_utf8(value) {
        Ok(text) => escape(text),
        Err(_) => format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(value)
        ),
    }
}

/// Escapes what would break a tab-separated line: backslash, tab, newlines and other control
/// characters. `--json` prints values exactly.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\t' => escaped.push_str("\\t"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if c.is_control() => escaped.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_escape_what_would_break_them() {
        assert_eq!(escape("a\tb\nc\\d\u{1}é"), "a\\tb\\nc\\\\d\\u{1}é");
        assert_eq!(key_field(None), "-");
        assert_eq!(value_field(&[0, 1, 0xff]), "base64:AAH/");
        let record = Record {
            offset: 7,
            timestamp_ms: 1,
            key: Some("k".into()),
            headers: Default::default(),
            value: "two\nlines".into(),
        };
        let mut out = Vec::new();
        print_record(&mut out, &record, false).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "7\tk\ttwo\\nlines\n");
        let mut out = Vec::new();
        print_record(&mut out, &record, true).unwrap();
        let back: Record = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, record);
    }
}
