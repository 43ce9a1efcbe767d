//! Publisher load through the SDK, and the judging of its publish histories against the
//! final log.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftq_client::api::{PublishResponse, Record, RecordIn};
use raftq_client::{Client, Error};

use super::Cluster;

impl Cluster {
    /// Checks a publish history against the final log of its topic (see
    /// [`history_violations`]) and fails the test on any violation. Returns a summary.
    pub fn check_history(
        &self,
        log: &[Record],
        histories: &[History],
        others: &[String],
    ) -> String {
        let (violations, summary) = history_violations(log, histories, others);
        if !violations.is_empty() {
            let shown = violations.len().min(30);
            self.fail(&format!(
                "the publish history does not match the log ({summary}); {} violations, the \
                 first {shown}:\n  {}",
                violations.len(),
                violations[..shown].join("\n  ")
            ));
        }
        summary
    }
}

/// Judges publish histories against the final log of their topic, as the chaos suite does
/// (CHECKERS.md): every acknowledged value is present exactly once, at the offset it was
/// acknowledged at (lost / duplicated / wrong offset); an indeterminate value at most once; a
/// definitely refused value never (aborted write); nothing in the log that nobody published
/// (unexpected); and each task's acknowledged offsets increase in acknowledgement order
/// (nonmonotonic send). `others` are values published outside the histories. Returns the
/// violations and a summary of the counts.
pub fn history_violations(
    log: &[Record],
    histories: &[History],
    others: &[String],
) -> (Vec<String>, String) {
    let mut positions: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut violations = Vec::new();
    for record in log {
        match record.value_str() {
            Some(value) => positions.entry(value).or_default().push(record.offset),
            None => violations.push(format!(
                "unexpected: offset {} holds a binary value {:?}",
                record.offset, record.value
            )),
        }
    }
    let found = |value: &str| positions.get(value).cloned().unwrap_or_default();
    let mut attempted: BTreeSet<&str> = others.iter().map(String::as_str).collect();
    let (mut acked, mut indeterminate, mut refused, mut recovered) = (0, 0, 0, 0);
    for history in histories {
        let mut previous: Option<(&str, u64)> = None;
        for (value, ack) in &history.acked {
            acked += 1;
            attempted.insert(value);
            let at = found(value);
            if at.is_empty() {
                violations.push(format!(
                    "lost: task {} value {value:?} was acknowledged at offset {} but is not in \
                     the log",
                    history.task, ack.first_offset
                ));
            } else if at.len() > 1 {
                violations.push(format!(
                    "duplicated: acknowledged value {value:?} is at offsets {at:?}"
                ));
            } else if at[0] != ack.first_offset || ack.last_offset != ack.first_offset {
                violations.push(format!(
                    "wrong offset: value {value:?} was acknowledged at offsets {}..={} but is \
                     at {}",
                    ack.first_offset, ack.last_offset, at[0]
                ));
            }
            if let Some((before, offset)) = previous {
                if ack.first_offset <= offset {
                    violations.push(format!(
                        "nonmonotonic send: task {} got {value:?} acknowledged at {} after \
                         {before:?} at {offset}",
                        history.task, ack.first_offset
                    ));
                }
            }
            previous = Some((value, ack.first_offset));
        }
        for (value, error) in &history.indeterminate {
            indeterminate += 1;
            attempted.insert(value);
            let at = found(value);
            if at.len() > 1 {
                violations.push(format!(
                    "duplicated: value {value:?} (indeterminate: {error}) is at offsets {at:?} \
                     although it was sent once"
                ));
            }
            recovered += at.len();
        }
        for (value, error) in &history.refused {
            refused += 1;
            attempted.insert(value);
            let at = found(value);
            if !at.is_empty() {
                violations.push(format!(
                    "aborted write visible: value {value:?} was definitely refused ({error}) \
                     but is at offsets {at:?}"
                ));
            }
        }
        for (value, error) in &history.odd {
            violations.push(format!(
                "the SDK answered {value:?} with an unexpected error: {error}"
            ));
        }
    }
    for record in log {
        if let Some(value) = record.value_str() {
            if !attempted.contains(value) {
                violations.push(format!(
                    "unexpected: offset {} holds {value:?}, which nobody published",
                    record.offset
                ));
            }
        }
    }
    let summary = format!(
        "{} records in the log; {acked} acknowledged, {indeterminate} indeterminate \
         ({recovered} of them present), {refused} definitely refused",
        log.len()
    );
    (violations, summary)
}

/// What one sequential publisher task saw, in order.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub task: usize,
    /// Values the SDK acknowledged (Ok), with the answer, in acknowledgement order.
    pub acked: Vec<(String, PublishResponse)>,
    /// Values whose publish may or may not have been applied (`Error::Indeterminate`).
    pub indeterminate: Vec<(String, String)>,
    /// Values definitely not applied (`Error::Api`, `Error::Unavailable`).
    pub refused: Vec<(String, String)>,
    /// Values answered with an error the SDK should never give here.
    pub odd: Vec<(String, String)>,
}

/// Publisher tasks running in the background.
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub acks: Arc<AtomicUsize>,
    handles: Vec<tokio::task::JoinHandle<History>>,
}

impl Load {
    /// Starts `tasks` tasks, each publishing up to `per_task` single-record batches one after
    /// the other through `client`, with values unique across tasks.
    pub fn start(client: &Client, topic: &str, tasks: usize, per_task: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicUsize::new(0));
        let handles = (0..tasks)
            .map(|task| {
                let (client, topic) = (client.clone(), topic.to_string());
                let (stop, acks) = (stop.clone(), acks.clone());
                tokio::spawn(async move {
                    let mut history = History {
                        task,
                        ..History::default()
                    };
                    for i in 0..per_task {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let value = format!("{topic}/t{task}/{i:06}");
                        let record = RecordIn::text(value.clone());
                        match client.publish_records(&topic, vec![record]).await {
                            Ok(ack) => {
                                history.acked.push((value, ack));
                                acks.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e @ Error::Indeterminate { .. }) => {
                                history.indeterminate.push((value, e.to_string()))
                            }
                            Err(e @ (Error::Api(_) | Error::Unavailable { .. })) => {
                                history.refused.push((value, e.to_string()))
                            }
                            Err(e) => history.odd.push((value, format!("{e:?}"))),
                        }
                    }
                    history
                })
            })
            .collect();
        Load {
            stop,
            acks,
            handles,
        }
    }

    /// Acknowledged publishes so far, over all tasks.
    pub fn acked(&self) -> usize {
        self.acks.load(Ordering::SeqCst)
    }

    /// Asks the tasks to stop after their current publish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits (at most `timeout` in all) for every task to finish and returns their histories.
    pub async fn finish(self, cluster: &Cluster, timeout: Duration) -> Vec<History> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut histories = Vec::with_capacity(self.handles.len());
        for handle in self.handles {
            match tokio::time::timeout_at(deadline, handle).await {
                Ok(Ok(history)) => histories.push(history),
                Ok(Err(e)) => cluster.fail(&format!("a publisher task failed: {e}")),
                Err(_) => cluster.fail(&format!(
                    "the publisher tasks did not finish within {timeout:?}"
                )),
            }
        }
        histories
    }
}

/// Waits until `load` has at least `target` acknowledged publishes.
pub async fn wait_acks(cluster: &Cluster, load: &Load, target: usize, timeout: Duration) {
    let acks = load.acks.clone();
    cluster
        .wait_for(
            &format!("{target} acknowledged publishes"),
            timeout,
            move || {
                let now = acks.load(Ordering::SeqCst);
                async move {
                    if now >= target {
                        Ok(())
                    } else {
                        Err(format!("{now} acknowledged"))
                    }
                }
            },
        )
        .await;
}
