//! Recording a history: [`History`] hands out processes and [`OpHandle`]s, and writes and
//! reads JSON lines.

use super::*;

struct Inner {
    start: Instant,
    events: Mutex<Vec<Event>>,
    next_process: AtomicU64,
}

/// The thread-safe recorder of a history. Cheap to clone (an `Arc`); every clone records into
/// the same history, with indexes and timestamps from one shared clock.
#[derive(Clone)]
pub struct History {
    inner: Arc<Inner>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History")
            .field("events", &self.len())
            .finish()
    }
}

impl History {
    /// An empty history; its clock starts now.
    pub fn new() -> History {
        History {
            inner: Arc::new(Inner {
                start: Instant::now(),
                events: Mutex::new(Vec::new()),
                next_process: AtomicU64::new(0),
            }),
        }
    }

    /// A fresh client process number (0, 1, 2, …, never reused). Take one per worker at the
    /// start, and a new one whenever the worker's op completed with `info` (or was dropped):
    /// that process is retired.
    pub fn next_process(&self) -> Process {
        Process::Client(self.inner.next_process.fetch_add(1, Ordering::Relaxed))
    }

    /// Microseconds since the history was created.
    pub fn elapsed_us(&self) -> u64 {
        self.inner.start.elapsed().as_micros() as u64
    }

    fn push(&self, mut event: Event) -> u64 {
        let mut events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        // Index and time are taken under the lock, so index order is time order.
        event.index = events.len() as u64;
        event.time_us = self.elapsed_us();
        let index = event.index;
        events.push(event);
        index
    }

    /// Records the invoke of `op` by `process` against `node`, and returns the handle through
    /// which its completion is recorded.
    pub fn invoke(&self, process: Process, node: Option<u64>, op: Op) -> OpHandle {
        let invoke_index = self.push(Event {
            index: 0,
            time_us: 0,
            process,
            node,
            kind: Kind::Invoke,
            op: op.clone(),
            invoke_index: None,
            result: None,
            error: None,
        });
        OpHandle {
            history: self.clone(),
            process,
            node,
            op,
            invoke_index,
            done: false,
        }
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// True when nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes every event so far as JSON lines.
    pub fn write_jsonl(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        write_jsonl(&self.events(), path)
    }
}

/// The pending operation returned by [`History::invoke`]; complete it exactly once with
/// [`ok`](OpHandle::ok), [`fail`](OpHandle::fail) or [`info`](OpHandle::info). Dropped
/// without a completion, it records `info` with error `"abandoned"` (so a cancelled future
/// still leaves a complete history; retire the process).
#[derive(Debug)]
pub struct OpHandle {
    history: History,
    process: Process,
    node: Option<u64>,
    op: Op,
    invoke_index: u64,
    done: bool,
}

impl OpHandle {
    /// The index of the invoke event.
    pub fn invoke_index(&self) -> u64 {
        self.invoke_index
    }

    /// The op being performed.
    pub fn op(&self) -> &Op {
        &self.op
    }

    /// The process performing it.
    pub fn process(&self) -> Process {
        self.process
    }

    /// Sets the node recorded on the completion (e.g. the leader a redirect led to).
    pub fn set_node(&mut self, node: Option<u64>) {
        self.node = node;
    }

    fn complete(&mut self, kind: Kind, result: Option<OpResult>, error: Option<String>) -> u64 {
        self.done = true;
        self.history.push(Event {
            index: 0,
            time_us: 0,
            process: self.process,
            node: self.node,
            kind,
            op: self.op.clone(),
            invoke_index: Some(self.invoke_index),
            result,
            error,
        })
    }

    /// It happened, with this answer. Returns the completion's index.
    ///
    /// # Panics
    /// When `result` is not the kind of result the op completes with (see [`OpResult`]).
    pub fn ok(mut self, result: OpResult) -> u64 {
        assert!(
            result.matches(&self.op),
            "a {} op cannot complete with {result:?}",
            self.op.f()
        );
        self.complete(Kind::Ok, Some(result), None)
    }

    /// It definitely did not happen. Returns the completion's index.
    pub fn fail(mut self, reason: impl Into<String>) -> u64 {
        self.complete(Kind::Fail, None, Some(reason.into()))
    }

    /// Unknown whether it happened; the process is retired. Returns the completion's index.
    pub fn info(mut self, reason: impl Into<String>) -> u64 {
        self.complete(Kind::Info, None, Some(reason.into()))
    }
}

impl Drop for OpHandle {
    fn drop(&mut self) {
        if !self.done {
            self.complete(Kind::Info, None, Some("abandoned".to_string()));
        }
    }
}

/// Writes `events` as JSON lines.
pub fn write_jsonl(events: &[Event], path: impl AsRef<Path>) -> anyhow::Result<()> {
    let path = path.as_ref();
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for event in events {
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a history written by [`write_jsonl`] (blank lines are skipped).
pub fn read_jsonl(path: impl AsRef<Path>) -> anyhow::Result<Vec<Event>> {
    let path = path.as_ref();
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: bad event", path.display(), n + 1))?;
        events.push(event);
    }
    Ok(events)
}
