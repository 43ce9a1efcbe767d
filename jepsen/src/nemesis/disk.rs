//! Disk faults: power loss (every unsynced write gone, on one node or on all at once), damaged
//! files, a full disk, and slow fsyncs. All but the damage need the nodes on fault disks
//! ([`Hosts::disk`], [`Hosts::power_loss`]); the damage is done to the files of a node that is
//! down, through its data directory ([`Hosts::data_dir`]).
//!
//! # Damage (`corrupt-minority`)
//! One node is killed; its data directory is copied aside (`nodeN.pre-damage/`, beside it)
//! before anything is touched; then one or two of its newest files are damaged: the
//! write-ahead log (`db/NNNNNN.log`), the table file (`db/NNNNNN.sst`) or the Raft log segment
//! (`log/NNNNNNNNNNNNNNNNNNNN.seg`), each the newest non-empty file of its kind by file number.
//! A plan is one of six equally likely sets ([`Damage::plan`]): each kind alone, a segment
//! with the write-ahead log or with the table file, or the write-ahead log with the table file.
//! A file is damaged by a few bytes flipped at a random point in the first 90 % of what was
//! written of it, or by being cut to a random length of that (a segment is preallocated whole,
//! and the zeros after its last frame are no data to damage).
//! A kind with no non-empty file is replaced by another kind ([`damage`]), so a node without
//! segments (a build that keeps its Raft log in RocksDB) still has its store damaged. After
//! the hold the node is started and watched
//! ([`observe_start`]): either it refuses to start (exits; its log must say "is damaged"), or
//! it starts and catches up with the leader's commit index (having said its data "is damaged":
//! a rejoin; or not: a silent start). When it refused, the copy is put back (exactly a clean
//! restart after a kill) and it is started again, so that the next fault and the final phase
//! have every node again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

use crate::hosts::{Dropped, Hosts};
use crate::workload::http::Http;

/// The words a node's refusal to start on damaged data must contain.
pub const DAMAGED: &str = "is damaged";
/// The words a node stopped by a full disk logs.
pub const NO_SPACE: &str = "No space left on device";
/// How long a node restarted on damaged data has to refuse or to catch up.
pub const OBSERVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Which file of a node's store to damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreFile {
    /// The newest non-empty write-ahead log, `db/NNNNNN.log`.
    Wal,
    /// The newest non-empty table file, `db/NNNNNN.sst`.
    Sst,
    /// The newest non-empty log segment, `log/NNNNNNNNNNNNNNNNNNNN.seg`.
    Segment,
}

impl StoreFile {
    /// Every kind, in the order [`damage`] tries them when the kind a step names has no file
    /// left to damage.
    pub const ALL: [StoreFile; 3] = [StoreFile::Wal, StoreFile::Sst, StoreFile::Segment];

    /// The directory that holds files of this kind, relative to the node's data directory.
    fn dir(self) -> &'static str {
        match self {
            StoreFile::Wal | StoreFile::Sst => "db",
            StoreFile::Segment => "log",
        }
    }

    /// The extension of files of this kind (without the dot).
    fn extension(self) -> &'static str {
        match self {
            StoreFile::Wal => "log",
            StoreFile::Sst => "sst",
            StoreFile::Segment => "seg",
        }
    }

    /// This kind, then the other kinds in the order of [`StoreFile::ALL`].
    fn with_fallbacks(self) -> impl Iterator<Item = StoreFile> {
        std::iter::once(self).chain(StoreFile::ALL.into_iter().filter(move |k| *k != self))
    }
}

/// How to damage one file; positions are in thousandths of the file's size, so that the plan
/// can be drawn before the file is seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Damage {
    /// XOR the bytes from `at_permille` (below 900: in the first 90 %) with `masks` (none zero).
    Flip {
        file: StoreFile,
        at_permille: u32,
        masks: Vec<u8>,
    },
    /// Cut the file to `to_permille` of its size (below 1000: always shorter).
    Truncate { file: StoreFile, to_permille: u32 },
}

impl Damage {
    pub fn file(&self) -> StoreFile {
        match self {
            Damage::Flip { file, .. } | Damage::Truncate { file, .. } => *file,
        }
    }

    /// Draws a plan: one of six file sets, each a sixth of the time: the WAL, the SST or the
    /// segment alone, the WAL and the SST, the segment and the SST, the segment and the WAL.
    /// Each file is flipped or cut (half the time each).
    pub fn plan(rng: &mut impl rand::Rng) -> Vec<Damage> {
        let files = match rng.gen_range(0..6) {
            0 => vec![StoreFile::Wal],
            1 => vec![StoreFile::Sst],
            2 => vec![StoreFile::Segment],
            3 => vec![StoreFile::Wal, StoreFile::Sst],
            4 => vec![StoreFile::Segment, StoreFile::Sst],
            _ => vec![StoreFile::Segment, StoreFile::Wal],
        };
        files
            .into_iter()
            .map(|file| {
                if rng.gen_bool(0.5) {
                    let n = rng.gen_range(1..=4);
                    Damage::Flip {
                        file,
                        at_permille: rng.gen_range(0..900),
                        masks: (0..n).map(|_| rng.gen_range(1..=255u8)).collect(),
                    }
                } else {
                    Damage::Truncate {
                        file,
                        to_permille: rng.gen_range(0..1000),
                    }
                }
            })
            .collect()
    }
}

/// What was done to one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Damaged {
    /// The path under the data directory, e.g. `db/000021.log` or
    /// `log/00000000000000000001.seg`.
    pub file: String,
    /// Its size before.
    pub size: u64,
    /// What was done, in words: `flipped 3 bytes at 1234`, `cut to 567 bytes`.
    pub what: String,
}

/// How a node restarted on its data went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Start {
    /// It exited on its own.
    Refused {
        /// How it exited (`exit status: 1`).
        exit: String,
        /// The line of its log that says why (the one with "is damaged", else its last lines).
        message: String,
        /// Its log says "is damaged".
        says_damaged: bool,
    },
    /// It runs: caught up with the leader's commit index (`caught_up`), or still running when
    /// the time to watch it ran out. `says_damaged`: its log says "is damaged" (it found the
    /// damage and rejoined, catching up from the others); otherwise it started on damaged data
    /// without a word.
    Started {
        caught_up: bool,
        says_damaged: bool,
        detail: String,
    },
}

impl Start {
    pub fn refused(&self) -> bool {
        matches!(self, Start::Refused { .. })
    }
}

/// How a `corrupt-minority` fault went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DamageOutcome {
    pub node: u64,
    /// What was damaged.
    pub damaged: Vec<Damaged>,
    /// The first start on the damaged data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
    /// When it refused: the start after its pre-damage copy was put back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_restore: Option<Start>,
    /// Where the pre-damage copy is (removed once the node runs again, kept otherwise).
    pub copy: PathBuf,
}

/// How a power loss went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PowerLossOutcome {
    /// What each node's disk lost.
    pub dropped: std::collections::BTreeMap<u64, Dropped>,
    /// Unsynced bytes lost on every disk together.
    pub bytes: u64,
    /// `powerloss-leader`: syncs the slowed disk had waiting when the power went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_fsyncs: Option<u64>,
    /// `powerloss-leader`: syncs the node asked for while its disk was slow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_fsyncs: Option<u64>,
}

/// How a `disk-full` fault went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DiskFullOutcome {
    pub node: u64,
    /// What its files took when the limit was set.
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// Writes refused for want of space while the limit held.
    pub enospc: u64,
    /// How it exited while the disk was full (`None`: it still ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
    /// The line of its log that says "No space left on device", if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where its log stood when the limit was set (bytes), to read what it logged since.
    #[serde(skip)]
    pub log_mark: usize,
}

/// How a `slow-fsync` fault went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SlowFsyncOutcome {
    pub node: u64,
    pub delay_ms: u64,
    /// Syncs asked for while the delay held.
    pub fsyncs: u64,
    /// Syncs still waiting when the delay was lifted.
    pub pending_at_end: u64,
    /// Counter of syncs when the delay was set.
    #[serde(skip)]
    pub fsyncs_before: u64,
}

/// The newest non-empty file with `extension` (by its number) under `dir`, with its written
/// length ([`written_len`]); `None` when there is none, or no `dir` at all (a build that keeps no segments has no `log/`).
fn newest(dir: &Path, extension: &str) -> anyhow::Result<Option<(PathBuf, u64)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut best: Option<(u64, PathBuf, u64)> = None;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(&format!(".{extension}")) else {
            continue;
        };
        let Ok(number) = stem.parse::<u64>() else {
            continue; // not a store file (`LOG`, `LOG.old.*`)
        };
        if best.as_ref().is_none_or(|(n, _, _)| number > *n) {
            let size = written_len(&entry.path())?;
            if size > 0 {
                best = Some((number, entry.path(), size));
            }
        }
    }
    Ok(best.map(|(_, path, size)| (path, size)))
}

/// A file's length without the zeros at its end: what was written of a file preallocated
/// whole (raftq's log segments are), so that damage lands in its data, not in the rest that
/// reads as zeros.
fn written_len(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut end = file.metadata()?.len();
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let piece = &mut chunk[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if let Some(at) = piece.iter().rposition(|b| *b != 0) {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Damages the node's store under `data` as `plan` says. When the kind a step names has no
/// non-empty file, or its newest one was already damaged by an earlier step, the step takes
/// the newest file of the first other kind that has one left, in the order of
/// [`StoreFile::ALL`]; a step that finds none is skipped. When no step found a file, it fails.
pub fn damage(data: &Path, plan: &[Damage]) -> anyhow::Result<Vec<Damaged>> {
    use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
    let mut done = Vec::new();
    let mut used: Vec<PathBuf> = Vec::new();
    for step in plan {
        let mut target = None;
        for kind in step.file().with_fallbacks() {
            if let Some((path, size)) = newest(&data.join(kind.dir()), kind.extension())? {
                if !used.contains(&path) {
                    target = Some((path, size));
                    break;
                }
            }
        }
        let Some((path, size)) = target else {
            continue;
        };
        used.push(path.clone());
        let name = path
            .strip_prefix(data)
            .unwrap_or(&path)
            .display()
            .to_string();
        let what = match step {
            Damage::Flip {
                at_permille, masks, ..
            } => {
                let at = size * u64::from(*at_permille) / 1000;
                let n = (masks.len() as u64).min(size - at);
                let mut file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                let mut bytes = vec![0u8; n as usize];
                file.seek(SeekFrom::Start(at))?;
                file.read_exact(&mut bytes)?;
                for (b, m) in bytes.iter_mut().zip(masks) {
                    *b ^= m;
                }
                file.seek(SeekFrom::Start(at))?;
                file.write_all(&bytes)?;
                file.sync_all()?;
                format!("flipped {n} byte(s) at {at}")
            }
            Damage::Truncate { to_permille, .. } => {
                let to = size * u64::from(*to_permille) / 1000;
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                file.set_len(to)?;
                file.sync_all()?;
                format!("cut to {to} bytes")
            }
        };
        done.push(Damaged {
            file: name,
            size,
            what,
        });
    }
    if done.is_empty() {
        bail!(
            "no write-ahead log, table file or log segment with data under {}: nothing to damage",
            data.display()
        );
    }
    Ok(done)
}

/// Checks that every file `damaged` names differs from its copy under `copy` (taken before
/// the damage): a fault that silently changed nothing must not pass for one.
pub fn verify_damage(data: &Path, copy: &Path, damaged: &[Damaged]) -> anyhow::Result<()> {
    for d in damaged {
        let now = std::fs::read(data.join(&d.file))
            .with_context(|| format!("cannot read back {}", d.file))?;
        let before = std::fs::read(copy.join(&d.file))
            .with_context(|| format!("cannot read the copy of {}", d.file))?;
        if now == before {
            bail!("{} is unchanged after it was damaged ({})", d.file, d.what);
        }
    }
    Ok(())
}

/// Copies the directory tree `from` to `to` (files, directories; nothing else is expected).
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot list {}", from.display()))?
    {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).with_context(|| {
                format!(
                    "cannot copy {} to {}",
                    entry.path().display(),
                    target.display()
                )
            })?;
        }
    }
    Ok(())
}

/// Empties `dir` (keeps the directory itself: it may be a mount point or a bind mount).
pub fn clear_dir(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Where node `id`'s pre-damage copy goes: beside its data directory.
pub fn copy_path(data: &Path) -> PathBuf {
    let name = data
        .file_name()
        .map_or_else(|| "node".into(), |n| n.to_string_lossy().into_owned());
    data.with_file_name(format!("{name}.pre-damage"))
}

/// The sentence of `log` that contains `needle` (to the first full stop after it), else its
/// last non-empty lines; at most 400 characters.
pub fn log_excerpt(log: &str, needle: &str) -> String {
    let text = match log.lines().find(|l| l.contains(needle)) {
        Some(line) => {
            let at = line.find(needle).unwrap_or(0);
            match line[at..].find(". ") {
                Some(end) => line[..at + end + 1].to_string(),
                None => line.to_string(),
            }
        }
        None => {
            let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            lines[lines.len().saturating_sub(3)..].join(" / ")
        }
    };
    text.chars().take(400).collect()
}

/// Starts `node` and watches it until it exits (it refused: how, and why by what it logged
/// since the start) or catches up with the leader's commit index as it was after the start, at
/// most [`OBSERVE_TIMEOUT`].
pub async fn observe_start<H: Hosts>(hosts: &H, http: &Http, node: u64) -> anyhow::Result<Start> {
    let mark = hosts.log(node).len();
    hosts.start(node).await?;
    let deadline = Instant::now() + OBSERVE_TIMEOUT;
    let mut target: Option<u64> = None;
    let mut last = String::from("no answer yet");
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !hosts.is_running(node) {
            let log = hosts.log(node);
            let since = log.get(mark..).unwrap_or(&log);
            return Ok(Start::Refused {
                exit: hosts
                    .exit_status(node)
                    .unwrap_or_else(|| "exited (status unknown)".into()),
                message: log_excerpt(since, DAMAGED),
                says_damaged: since.contains(DAMAGED),
            });
        }
        if target.is_none() {
            if let Some(leader) = super::find_leader(http).await.filter(|l| *l != node) {
                let status: Option<raftq_client::api::ClusterStatus> = http
                    .get_json(leader, "/v1/cluster", Duration::from_secs(2))
                    .await;
                target = status.map(|s| s.commit_index);
            }
        }
        let status: Option<raftq_client::api::ClusterStatus> = http
            .get_json(node, "/v1/cluster", Duration::from_secs(2))
            .await;
        let says_damaged = || {
            let log = hosts.log(node);
            log.get(mark..).unwrap_or(&log).contains(DAMAGED)
        };
        if let Some(s) = &status {
            last = format!(
                "applied {} of the leader's {}",
                s.last_applied,
                target.map_or_else(|| "(unknown)".into(), |t| t.to_string())
            );
            if target.is_some_and(|t| s.last_applied >= t) {
                return Ok(Start::Started {
                    caught_up: true,
                    says_damaged: says_damaged(),
                    detail: last,
                });
            }
        }
        if Instant::now() >= deadline {
            return Ok(Start::Started {
                caught_up: false,
                says_damaged: says_damaged(),
                detail: format!("still running after {OBSERVE_TIMEOUT:?}: {last}"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    /// Writes `files` (paths relative to the data directory `dir`, each of the given size)
    /// with the bytes `0, 1, …, 250, 0, 1, …`.
    fn store(dir: &Path, files: &[(&str, usize)]) {
        for (name, size) in files {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap_or_default();
            }
            let bytes: Vec<u8> = (0..*size).map(|i| (i % 251) as u8).collect();
            std::fs::write(path, bytes).unwrap_or_default();
        }
    }

    fn size(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("raftq-jepsen-damage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn damage_takes_the_newest_non_empty_files() {
        let dir = tempdir("newest");
        store(
            &dir,
            &[
                ("db/000007.log", 0),
                ("db/000005.log", 1000),
                ("db/000003.log", 500),
                ("db/000004.sst", 2000),
                ("db/000009.sst", 3000),
                ("db/LOG", 50),
                ("db/LOG.old.123", 50),
                // Segments: number 42 is the newest non-empty one; 100 is newer but empty.
                ("log/00000000000000000001.seg", 4000),
                ("log/00000000000000000042.seg", 1200),
                ("log/00000000000000000100.seg", 0),
                // Not segments: another extension in log/, a segment's extension in db/.
                ("log/00000000000000000200.tmp", 50),
                ("db/000300.seg", 50),
            ],
        );
        let done = damage(
            &dir,
            &[
                Damage::Flip {
                    file: StoreFile::Wal,
                    at_permille: 500,
                    masks: vec![0xff, 0x01],
                },
                Damage::Truncate {
                    file: StoreFile::Sst,
                    to_permille: 100,
                },
                Damage::Flip {
                    file: StoreFile::Segment,
                    at_permille: 250,
                    masks: vec![0x80],
                },
            ],
        )
        .unwrap_or_default();
        assert_eq!(done.len(), 3, "{done:?}");
        assert_eq!(done[0].file, "db/000005.log");
        assert_eq!(done[1].file, "db/000009.sst");
        assert_eq!(done[2].file, "log/00000000000000000042.seg");
        assert_eq!(done[2].size, 1200);
        // Against an undamaged copy, the damage shows; against itself, it does not.
        let copy = tempdir("newest-copy");
        store(
            &copy,
            &[
                ("db/000005.log", 1000),
                ("db/000009.sst", 3000),
                ("log/00000000000000000042.seg", 1200),
            ],
        );
        assert!(verify_damage(&dir, &copy, &done).is_ok());
        assert!(verify_damage(&dir, &dir, &done).is_err());
        // The check reads segments back from `log/` too: one that matches its copy fails it.
        let segment_only = &done[2..];
        assert!(verify_damage(&dir, &copy, segment_only).is_ok());
        std::fs::copy(
            dir.join("log/00000000000000000042.seg"),
            copy.join("log/00000000000000000042.seg"),
        )
        .unwrap_or_default();
        assert!(verify_damage(&dir, &copy, segment_only).is_err());
        let _ = std::fs::remove_dir_all(&copy);
        assert_eq!(done[0].what, "flipped 2 byte(s) at 500");
        let wal = std::fs::read(dir.join("db/000005.log")).unwrap_or_default();
        assert_eq!(wal[500], (500 % 251) as u8 ^ 0xff);
        assert_eq!(wal[501], (501 % 251) as u8 ^ 0x01);
        assert_eq!(wal[502], (502 % 251) as u8);
        assert_eq!(done[1].what, "cut to 300 bytes");
        assert_eq!(size(&dir.join("db/000009.sst")), 300);
        assert_eq!(done[2].what, "flipped 1 byte(s) at 300");
        let segment = std::fs::read(dir.join("log/00000000000000000042.seg")).unwrap_or_default();
        assert_eq!(segment[299], (299 % 251) as u8);
        assert_eq!(segment[300], (300 % 251) as u8 ^ 0x80);
        assert_eq!(segment[301], (301 % 251) as u8);
        // Untouched: the older files, the empty ones, the info logs and the files that are not
        // of a kind in their directory.
        assert_eq!(size(&dir.join("db/000004.sst")), 2000);
        assert_eq!(size(&dir.join("log/00000000000000000100.seg")), 0);
        for (name, len) in [
            ("log/00000000000000000001.seg", 4000),
            ("log/00000000000000000200.tmp", 50),
            ("db/000300.seg", 50),
        ] {
            let bytes = std::fs::read(dir.join(name)).unwrap_or_default();
            let expected: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert!(bytes == expected, "{name} changed");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn damage_falls_back_to_the_other_kinds_and_fails_on_nothing() {
        let cut = |file| Damage::Truncate {
            file,
            to_permille: 0,
        };
        let dir = tempdir("fallback");
        store(
            &dir,
            &[
                ("db/000003.log", 100),
                ("db/000004.log", 0),
                ("log/00000000000000000007.seg", 100),
            ],
        );
        // No table file: the SST step takes the WAL (before the segment, in the order of
        // `StoreFile::ALL`); the WAL step then finds its file taken and no table file, and
        // takes the segment.
        let done = damage(&dir, &[cut(StoreFile::Sst), cut(StoreFile::Wal)]).unwrap_or_default();
        assert_eq!(done.len(), 2, "{done:?}");
        assert_eq!(done[0].file, "db/000003.log");
        assert_eq!(done[0].what, "cut to 0 bytes");
        assert_eq!(done[1].file, "log/00000000000000000007.seg");
        assert_eq!(done[1].what, "cut to 0 bytes");
        // Now every file is empty: nothing to damage, whatever the kind.
        for kind in StoreFile::ALL {
            assert!(damage(&dir, &[cut(kind)]).is_err(), "{kind:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);

        // No `log/` at all (a build without segments): a segment step takes the WAL.
        let dir = tempdir("fallback-no-log");
        store(&dir, &[("db/000003.log", 100)]);
        let done = damage(&dir, &[cut(StoreFile::Segment)]).unwrap_or_default();
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(done[0].file, "db/000003.log");
        assert!(damage(&dir, &[cut(StoreFile::Segment)]).is_err());
        let _ = std::fs::remove_dir_all(&dir);

        // Segments only: a WAL step takes the newest segment.
        let dir = tempdir("fallback-segments");
        store(
            &dir,
            &[
                ("log/00000000000000000001.seg", 100),
                ("log/00000000000000000009.seg", 100),
            ],
        );
        let done = damage(&dir, &[cut(StoreFile::Wal)]).unwrap_or_default();
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(done[0].file, "log/00000000000000000009.seg");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn copies_and_restores_a_tree() {
        let dir = tempdir("copy");
        store(&dir, &[("db/000003.log", 100), ("db/000004.sst", 10)]);
        std::fs::write(dir.join("IDENTITY"), "x").unwrap_or_default();
        let copy = copy_path(&dir);
        let _ = std::fs::remove_dir_all(&copy);
        copy_tree(&dir, &copy).unwrap_or_else(|e| panic!("{e:#}"));
        let _ = damage(
            &dir,
            &[Damage::Truncate {
                file: StoreFile::Wal,
                to_permille: 0,
            }],
        );
        clear_dir(&dir).unwrap_or_else(|e| panic!("{e:#}"));
        copy_tree(&copy, &dir).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            std::fs::metadata(dir.join("db/000003.log")).map_or(0, |m| m.len()),
            100
        );
        assert!(dir.join("IDENTITY").is_file());
        assert!(copy.to_string_lossy().ends_with(".pre-damage"));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&copy);
    }

    #[test]
    fn plans_cover_every_file_set_and_both_kinds_of_damage() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let (mut flips, mut cuts) = (0, 0);
        let mut sets: std::collections::BTreeMap<String, u32> = Default::default();
        for _ in 0..600 {
            let plan = Damage::plan(&mut rng);
            assert!(!plan.is_empty() && plan.len() <= 2);
            let files: Vec<StoreFile> = plan.iter().map(Damage::file).collect();
            assert!(files.len() == 1 || files[0] != files[1], "{files:?}");
            *sets.entry(format!("{files:?}")).or_default() += 1;
            for d in &plan {
                match d {
                    Damage::Flip {
                        at_permille, masks, ..
                    } => {
                        assert!(*at_permille < 900);
                        assert!(!masks.is_empty() && masks.iter().all(|m| *m != 0));
                        flips += 1;
                    }
                    Damage::Truncate { to_permille, .. } => {
                        assert!(*to_permille < 1000);
                        cuts += 1;
                    }
                }
            }
        }
        // Six sets, each a sixth of the time (100 of 600 expected).
        let expected = [
            "[Wal]",
            "[Sst]",
            "[Segment]",
            "[Wal, Sst]",
            "[Segment, Sst]",
            "[Segment, Wal]",
        ];
        assert_eq!(sets.len(), expected.len(), "{sets:?}");
        for set in expected {
            assert!(sets.get(set).is_some_and(|n| *n > 60), "{set}: {sets:?}");
        }
        // About 900 files, half of them flipped.
        assert!(flips > 350 && cuts > 350, "{flips} {cuts}");
    }

    #[test]
    fn file_kinds_serialize_in_snake_case() {
        let names: Vec<String> = StoreFile::ALL
            .iter()
            .map(|k| serde_json::to_string(k).unwrap_or_default())
            .collect();
        assert_eq!(names, ["\"wal\"", "\"sst\"", "\"segment\""]);
    }

    #[test]
    fn excerpts_find_the_reason() {
        let log = "start\nERROR the data directory /d of node 2 is damaged: WAL\nbye\n";
        assert_eq!(
            log_excerpt(log, DAMAGED),
            "ERROR the data directory /d of node 2 is damaged: WAL"
        );
        let log = "error: the data directory /d is damaged: checksum mismatch. This node may \
                   have lost log entries. To recover, move /d aside.";
        assert_eq!(
            log_excerpt(log, DAMAGED),
            "error: the data directory /d is damaged: checksum mismatch."
        );
        assert_eq!(log_excerpt("a\nb\n\nc\nd\n", DAMAGED), "b / c / d");
    }
}
