//! Checkers that judge a history: pure functions over `&[Event]`.
//!
//! - [`queue::check`] (also [`check_queue`]): the queue workload (publish, pull, ack), after
//!   Jepsen's `total-queue` checker plus the leased queue's own properties.
//! - [`stream::check`] (also [`check_stream`]): the stream workload (publish, read with
//!   subscriptions, cursors), after Jepsen's Kafka queue workload.
//!
//! Each returns a report (serde `Serialize`) with, for each anomaly, an [`Anomaly`]: a count
//! and up to [`MAX_EXAMPLES`] [`Finding`]s naming the events involved; a `valid` flag; and a
//! [`Verdict`] for a results table (`report.verdict("scenario")`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::history::OpCounts;

pub mod queue;
pub mod stream;

pub use queue::{check as check_queue, check_ack_count, AckCount, QueueOptions, QueueReport};
pub use stream::{check as check_stream, StreamReport};

/// Most examples kept per anomaly.
pub const MAX_EXAMPLES: usize = 10;

/// One example of an anomaly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub topic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Indexes of the events involved (invokes and/or completions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<u64>,
    /// What is wrong, in words.
    pub detail: String,
}

/// How often one anomaly occurred, with the first few examples.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    pub count: u64,
    pub examples: Vec<Finding>,
}

impl Anomaly {
    /// Counts one occurrence and keeps it as an example if there is room.
    pub fn push(&mut self, finding: Finding) {
        self.count += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(finding);
        }
    }

    /// True when it never occurred.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// One line of a results table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// `"queue"` or `"stream"`.
    pub checker: String,
    pub scenario: String,
    /// Client operations (invokes) and their outcomes (faults excluded).
    pub ops: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
    /// Count of every anomaly the checker looks for, by name (zeros included).
    pub anomalies: BTreeMap<String, u64>,
    /// Names of the anomalies that make the history invalid and occurred.
    pub failures: Vec<String>,
    pub valid: bool,
}

impl Verdict {
    pub(crate) fn new(
        checker: &str,
        scenario: &str,
        counts: OpCounts,
        anomalies: &[(&str, &Anomaly, bool)],
    ) -> Verdict {
        let failures: Vec<String> = anomalies
            .iter()
            .filter(|(_, a, fatal)| *fatal && !a.is_empty())
            .map(|(name, _, _)| name.to_string())
            .collect();
        Verdict {
            checker: checker.to_string(),
            scenario: scenario.to_string(),
            ops: counts.ops,
            ok: counts.ok,
            fail: counts.fail,
            info: counts.info,
            anomalies: anomalies
                .iter()
                .map(|(name, a, _)| (name.to_string(), a.count))
                .collect(),
            valid: failures.is_empty(),
            failures,
        }
    }

    /// Adds an anomaly found outside the history's checker (the run's own checks: state
    /// digests, faults that could not be applied): its count, and when it is `fatal` and
    /// occurred, a failure that makes the verdict invalid.
    pub fn add(&mut self, name: &str, count: u64, fatal: bool) {
        self.anomalies.insert(name.to_string(), count);
        if fatal && count > 0 && !self.failures.iter().any(|f| f == name) {
            self.failures.push(name.to_string());
        }
        self.valid = self.failures.is_empty();
    }

    /// The anomalies that occurred, as `name=count, ...`, or `none`.
    pub fn anomalies_found(&self) -> String {
        let found: Vec<String> = self
            .anomalies
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        if found.is_empty() {
            "none".to_string()
        } else {
            found.join(", ")
        }
    }

    /// A Markdown table of verdicts: scenario, checker, ops, ok/fail/info, the anomalies that
    /// occurred (`name=count`), valid.
    pub fn markdown_table(verdicts: &[Verdict]) -> String {
        let mut out = String::from(
            "| scenario | checker | ops | ok | fail | info | anomalies | valid |\n|---|---|---|---|---|---|---|---|\n",
        );
        for v in verdicts {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                v.scenario,
                v.checker,
                v.ops,
                v.ok,
                v.fail,
                v.info,
                v.anomalies_found(),
                if v.valid { "yes" } else { "**NO**" }
            ));
        }
        out
    }
}
