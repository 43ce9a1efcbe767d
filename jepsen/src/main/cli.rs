//! The command line: the subcommands and their arguments, and what they are parsed into
//! (durations, the subnet, the server binary, the output directory's timestamp).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use raftq_jepsen::nemesis::Scenario;
use raftq_jepsen::workload::Workload;

#[derive(Debug, Parser)]
#[command(
    name = "raftq-jepsen",
    about = "raftq's chaos suite: faults, histories, checkers"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// One scenario: workload + nemesis, final drain and reads, checker.
    Run(RunArgs),
    /// Several scenarios one after the other, then the table.
    Matrix(MatrixArgs),
    /// Judges a recorded history again.
    Check(CheckArgs),
    /// The negative control's verdict on a run's `results.json`: exits 0 only when the run is
    /// INVALID because some, but not all, acknowledged records were lost (and its faults all
    /// happened); 1 otherwise.
    ExpectLoss(ExpectLossArgs),
}

#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// The fault.
    #[arg(long, value_enum, default_value = "kill-leader")]
    pub(crate) scenario: Scenario,
    /// Output directory (history, results, node logs and data). Default:
    /// chaos-runs/<timestamp>-<scenario>.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct MatrixArgs {
    /// Scenarios to run, comma-separated (default: all of them).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) scenarios: Vec<Scenario>,
    /// Output directory; each scenario gets `<scenario>-<workload>/` in it. Default:
    /// chaos-runs/<timestamp>.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// Which kind of hosts the nodes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HostsKind {
    /// Linux network namespaces joined by a bridge; the nodes are child processes.
    Netns,
    /// Containers on a private Docker network, from an image built out of the server binary.
    Docker,
}

impl HostsKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            HostsKind::Netns => "netns",
            HostsKind::Docker => "docker",
        }
    }

    /// The default subnet: different for each kind, so that leftovers of one never collide
    /// with the other.
    pub(crate) fn default_subnet(self) -> &'static str {
        match self {
            HostsKind::Netns => "10.231.0",
            HostsKind::Docker => "10.232.0",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub(crate) struct Common {
    /// Where the nodes run: network namespaces, or Docker containers.
    #[arg(long, value_enum, default_value = "netns")]
    pub(crate) hosts: HostsKind,
    /// What the clients do.
    #[arg(long, value_enum, default_value = "queue")]
    pub(crate) workload: Workload,
    /// How long the workload and the faults run (`20s`, `2m`, `1500ms`, or seconds).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// The `raftq` server binary. Default: `raftq` next to this executable, else
    /// `$CARGO_TARGET_DIR/release/raftq`.
    #[arg(long, env = "RAFTQ_BIN")]
    pub(crate) raftq_bin: Option<PathBuf>,
    /// Seed of the nemesis's choices (default: from the clock; printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Concurrent publishers.
    #[arg(long, default_value_t = 3)]
    pub(crate) publishers: usize,
    /// Concurrent consumers (queue) or readers (stream).
    #[arg(long, default_value_t = 2)]
    pub(crate) consumers: usize,
    /// Most client operations in the workload phase.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) max_ops: u64,
    /// Quiet time before each fault (default: the scenario's).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) quiet: Option<Duration>,
    /// How long each fault holds (default: the scenario's).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) hold: Option<Duration>,
    /// First three octets of the private /24 the hosts use (default: 10.231.0 for netns,
    /// 10.232.0 for docker).
    #[arg(long)]
    pub(crate) subnet: Option<String>,
    /// Prefix of the names of everything the hosts create (namespaces `<prefix>-nN`, bridge
    /// `<prefix>0`, veths; containers, network and image): at most 8 letters or digits. Give
    /// two runs on one machine different prefixes and subnets.
    #[arg(long, default_value = "rqj")]
    pub(crate) name_prefix: String,
    /// Keep the nodes' data directories of valid runs too (invalid runs always keep them).
    #[arg(long)]
    pub(crate) keep_data: bool,
    /// libfaketime, for the clock scenarios (default: where Debian's `faketime` package puts
    /// it).
    #[arg(long, env = "FAKETIME_LIB")]
    pub(crate) faketime_lib: Option<PathBuf>,
    /// In the clock scenarios, step the nodes' monotonic clocks along with their wall clocks:
    /// a fault no server can mask (its own time leaps), to show that the clock checks see
    /// early expiries and deletions. Such a run must be INVALID.
    #[arg(long)]
    pub(crate) fake_monotonic: bool,
    /// The nodes' memtable size (`raftq serve --write-buffer-bytes`), for every scenario: a
    /// small one makes a short run flush memtables to table files, so faults meet flushes and
    /// compactions (corrupt-minority always uses 64 KiB).
    #[arg(long, value_name = "BYTES")]
    pub(crate) write_buffer_bytes: Option<u64>,
    /// The nodes build a snapshot every N log entries and keep N/5 behind it (`raftq serve
    /// --snapshot-logs`, `--snapshot-keep-logs`), for every scenario: snapshots, log purges and
    /// transfers then happen within a short run (the power-loss, disk and corruption scenarios
    /// always use 500).
    #[arg(long, value_name = "N")]
    pub(crate) snapshot_logs: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct CheckArgs {
    /// A `history.jsonl`.
    #[arg(long)]
    pub(crate) history: PathBuf,
    #[arg(long, value_enum, default_value = "queue")]
    pub(crate) workload: Workload,
    /// The subscription's lease length in the run (the clock scenarios use 20000).
    #[arg(long, default_value_t = 3000)]
    pub(crate) ack_timeout_ms: u64,
    /// The topic with retention by age, if the run had one (the clock scenarios:
    /// `jepsen-aged`), and its maximum age.
    #[arg(long, requires = "max_age_ms")]
    pub(crate) retention_topic: Option<String>,
    #[arg(long, requires = "retention_topic")]
    pub(crate) max_age_ms: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ExpectLossArgs {
    /// The `results.json` of the run.
    #[arg(long)]
    pub(crate) results: PathBuf,
}

/// `20s`, `2m`, `1500ms`, `1h`, or a number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (try 20s, 2m, 1500ms)"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}")),
    };
    Ok(Duration::from_secs_f64(seconds))
}

/// The server binary: the flag or `RAFTQ_BIN`; else `raftq` beside this executable (both are
/// built into the same target directory); else `$CARGO_TARGET_DIR/release/raftq`.
pub(crate) fn resolve_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path.to_path_buf());
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("raftq"));
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(target).join("release").join("raftq"));
    }
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "no raftq binary found (looked at {candidates:?}); build it with \
                 `cargo build --release --bin raftq` or pass --raftq-bin / RAFTQ_BIN"
            )
        })
}

pub(crate) fn parse_subnet(text: &str) -> anyhow::Result<[u8; 3]> {
    let parts: Vec<u8> = text
        .split('.')
        .map(|p| p.parse::<u8>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--subnet must be three octets like 10.231.0, not {text:?}"))?;
    let [a, b, c] = parts[..] else {
        bail!("--subnet must be three octets like 10.231.0, not {text:?}");
    };
    let private = a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168);
    if !private {
        bail!("--subnet {text} is not a private range (10/8, 172.16/12, 192.168/16)");
    }
    Ok([a, b, c])
}

/// UTC `YYYYMMDD-HHMMSS`, for directory names.
pub(crate) fn timestamp() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // `YYYY-MM-DDTHH:MM:SS.mmmZ` without its separators and milliseconds.
    let t = raftq_client::api::utc_time(ms);
    let digits = |from: usize, to: usize| t[from..to].replace(['-', ':'], "");
    format!("{}-{}", digits(0, 10), digits(11, 19))
}
