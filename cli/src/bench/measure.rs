//! What `raftq bench` measures besides rates: latency histograms, errors, resident memory and
//! the disk's fsync ceiling.

use super::*;

pub(super) fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs to 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub(super) fn latency(h: &Histogram<u64>) -> Option<Latency> {
    if h.is_empty() {
        return None;
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Some(Latency {
        p50: ms(h.value_at_quantile(0.5)),
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
        mean: h.mean() / 1000.0,
    })
}

/// Errors of a workload's tasks: how many, and the first one.
#[derive(Default)]
pub(super) struct Errors {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Errors {
    pub(super) fn record(&self, text: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(text);
    }

    pub(super) fn take(&self) -> (u64, Option<String>) {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        (self.count.load(Ordering::Relaxed), first)
    }
}

/// Samples the resident memory of the watched processes until finished.
pub(super) struct MemoryWatch {
    samples: Arc<Mutex<Vec<Memory>>>,
    task: tokio::task::JoinHandle<()>,
}

pub(super) fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

impl MemoryWatch {
    pub(super) fn start(pids: &[u32]) -> MemoryWatch {
        let first: Vec<Memory> = pids
            .iter()
            .map(|&pid| {
                let rss = rss_mib(pid).unwrap_or(0.0);
                Memory {
                    pid,
                    rss_start_mib: rss,
                    rss_peak_mib: rss,
                    rss_end_mib: rss,
                }
            })
            .collect();
        let samples = Arc::new(Mutex::new(first));
        let shared = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut samples = shared.lock().unwrap_or_else(|e| e.into_inner());
                for m in samples.iter_mut() {
                    if let Some(rss) = rss_mib(m.pid) {
                        m.rss_peak_mib = m.rss_peak_mib.max(rss);
                        m.rss_end_mib = rss;
                    }
                }
            }
        });
        MemoryWatch { samples, task }
    }

    pub(super) fn finish(self) -> Vec<Memory> {
        self.task.abort();
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .map(|m| {
                let end = rss_mib(m.pid).unwrap_or(m.rss_end_mib);
                Memory {
                    pid: m.pid,
                    rss_start_mib: round(m.rss_start_mib, 1),
                    rss_peak_mib: round(m.rss_peak_mib.max(end), 1),
                    rss_end_mib: round(end, 1),
                }
            })
            .collect()
    }
}

/// Appends blocks of `block` bytes to a new file at `path`, each followed by fdatasync, for
/// `secs`; returns appends per second (4 KiB blocks) or MiB per second (larger ones).
pub(super) fn append_fsync(
    path: &std::path::Path,
    block: usize,
    secs: Duration,
) -> std::io::Result<f64> {
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)?;
    let mut data = vec![0u8; block];
    rand::thread_rng().fill_bytes(&mut data);
    let start = Instant::now();
    let mut count = 0u64;
    while start.elapsed() < secs {
        file.write_all(&data)?;
        file.sync_data()?;
        count += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(if block <= 4096 {
        count as f64 / elapsed
    } else {
        count as f64 * block as f64 / (1 << 20) as f64 / elapsed
    })
}

pub(super) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Linux reports CPU time in `/proc/PID/stat` in clock ticks of `USER_HZ`, 100 on every
/// architecture raftq builds for.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds (user and system, every thread) and bytes written to storage (`write_bytes`:
/// pages dirtied for files, counted when written, whoever flushes them) of one process so far;
/// `None` when it is gone or its files cannot be read.
pub(super) fn usage(pid: Option<u32>) -> Option<(f64, u64)> {
    let dir = pid.map_or("/proc/self".to_string(), |p| format!("/proc/{p}"));
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let io = std::fs::read_to_string(format!("{dir}/io")).ok()?;
    let written = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()?;
    Some((ticks as f64 / TICKS_PER_SEC, written))
}

/// What each record of a workload cost: the CPU time of the watched processes (the nodes) and
/// of this one (the client), and the bytes the nodes wrote to disk, over the workload.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// Records the costs are divided by (the workload's `done`).
    pub records: u64,
    /// CPU time of all the watched processes together, per record.
    pub nodes_cpu_us_per_record: f64,
    /// CPU time of `raftq bench` itself, per record.
    pub client_cpu_us_per_record: f64,
    /// Bytes written to disk per record, averaged over the watched processes.
    pub disk_bytes_per_record_per_node: f64,
    pub processes: Vec<ProcessCost>,
}

/// One watched process over a workload.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCost {
    pub pid: u32,
    pub cpu_secs: f64,
    pub write_bytes: u64,
}

/// The CPU and disk counters of the watched processes and of this one when a workload starts.
pub(super) struct CostWatch {
    start: Vec<(u32, Option<(f64, u64)>)>,
    client: Option<(f64, u64)>,
}

impl CostWatch {
    pub(super) fn start(pids: &[u32]) -> CostWatch {
        CostWatch {
            start: pids.iter().map(|&p| (p, usage(Some(p)))).collect(),
            client: usage(None),
        }
    }

    /// The costs since `start`, divided by `records`; `None` without watched processes, without
    /// records, or when a counter could not be read (a process gone, `/proc` not Linux's).
    pub(super) fn finish(self, records: u64) -> Option<Cost> {
        if self.start.is_empty() || records == 0 {
            return None;
        }
        let mut processes = Vec::new();
        for (pid, start) in self.start {
            let (cpu0, w0) = start?;
            let (cpu1, w1) = usage(Some(pid))?;
            processes.push(ProcessCost {
                pid,
                cpu_secs: round(cpu1 - cpu0, 2),
                write_bytes: w1.saturating_sub(w0),
            });
        }
        let (client0, _) = self.client?;
        let (client1, _) = usage(None)?;
        let per_record_us = |secs: f64| round(secs * 1e6 / records as f64, 1);
        let nodes_cpu: f64 = processes.iter().map(|p| p.cpu_secs).sum();
        let written: u64 = processes.iter().map(|p| p.write_bytes).sum();
        Some(Cost {
            records,
            nodes_cpu_us_per_record: per_record_us(nodes_cpu),
            client_cpu_us_per_record: per_record_us(client1 - client0),
            disk_bytes_per_record_per_node: round(
                written as f64 / processes.len() as f64 / records as f64,
                0,
            ),
            processes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_this_process_cpu_and_writes() {
        let (cpu0, w0) = usage(None).expect("this process's counters");
        // Burn some CPU and write a file, synced, so both counters must move.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let dir = std::env::temp_dir().join(format!("raftq-usage-{}", std::process::id()));
        let data = vec![7u8; 1 << 20];
        std::fs::write(&dir, &data).expect("write probe file");
        std::fs::File::open(&dir)
            .and_then(|f| f.sync_all())
            .expect("sync");
        let (cpu1, w1) = usage(None).expect("this process's counters");
        std::fs::remove_file(&dir).ok();
        assert!(cpu1 - cpu0 >= 0.2, "CPU seconds moved by {}", cpu1 - cpu0);
        assert!(w1 - w0 >= 1 << 20, "write_bytes moved by {}", w1 - w0);
    }

    #[test]
    fn a_process_that_is_gone_gives_no_cost() {
        let watch = CostWatch {
            start: vec![(u32::MAX, Some((1.0, 10)))],
            client: usage(None),
        };
        assert!(watch.finish(100).is_none());
    }
}
