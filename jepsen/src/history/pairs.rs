//! Reading a history back for the checkers: each invoke with its completion ([`pairs`]), and
//! the counts of outcomes ([`op_counts`]).

use super::*;

/// An invoke and its completion (`None` when the history ended first).
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    pub invoke: &'a Event,
    pub completion: Option<&'a Event>,
}

impl<'a> Pair<'a> {
    /// The op.
    pub fn op(&self) -> &'a Op {
        &self.invoke.op
    }

    /// The outcome: the completion's kind, or [`Kind::Info`] when there is none (an op
    /// that never completed may or may not have happened).
    pub fn outcome(&self) -> Kind {
        self.completion.map_or(Kind::Info, |c| c.kind)
    }

    /// The result of an `ok` completion.
    pub fn result(&self) -> Option<&'a OpResult> {
        self.completion
            .filter(|c| c.kind == Kind::Ok)
            .and_then(|c| c.result.as_ref())
    }

    /// Index of the invoke.
    pub fn invoke_index(&self) -> u64 {
        self.invoke.index
    }

    /// Index of the completion; `u64::MAX` when there is none (it completes "never").
    pub fn complete_index(&self) -> u64 {
        self.completion.map_or(u64::MAX, |c| c.index)
    }

    /// The process.
    pub fn process(&self) -> Process {
        self.invoke.process
    }
}

/// Pairs every invoke with its completion, in invoke order. A completion names its invoke by
/// `invoke_index`; one without it (a hand-written history) completes its process's oldest
/// pending invoke, as in Jepsen. Completions without an invoke are ignored.
pub fn pairs(events: &[Event]) -> Vec<Pair<'_>> {
    let mut out: Vec<Pair<'_>> = Vec::new();
    let mut slot_of_index: HashMap<u64, usize> = HashMap::new();
    let mut pending_by_process: HashMap<Process, Vec<usize>> = HashMap::new();
    for event in events {
        if event.kind == Kind::Invoke {
            slot_of_index.insert(event.index, out.len());
            pending_by_process
                .entry(event.process)
                .or_default()
                .push(out.len());
            out.push(Pair {
                invoke: event,
                completion: None,
            });
            continue;
        }
        let slot = match event.invoke_index {
            Some(i) => slot_of_index.get(&i).copied(),
            None => pending_by_process.get(&event.process).and_then(|pending| {
                pending
                    .iter()
                    .copied()
                    .find(|&s| out[s].completion.is_none())
            }),
        };
        if let Some(s) = slot {
            if out[s].completion.is_none() {
                out[s].completion = Some(event);
            }
        }
    }
    out
}

/// Counts of client operations (faults excluded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCounts {
    /// Invocations.
    pub ops: u64,
    pub ok: u64,
    pub fail: u64,
    /// `info` completions, plus invokes that never completed.
    pub info: u64,
}

/// Counts the client operations of a history by outcome.
pub fn op_counts(events: &[Event]) -> OpCounts {
    let mut counts = OpCounts::default();
    for pair in pairs(events) {
        if !pair.op().is_client() {
            continue;
        }
        counts.ops += 1;
        match pair.outcome() {
            Kind::Ok => counts.ok += 1,
            Kind::Fail => counts.fail += 1,
            Kind::Info | Kind::Invoke => counts.info += 1,
        }
    }
    counts
}
