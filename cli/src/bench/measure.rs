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
