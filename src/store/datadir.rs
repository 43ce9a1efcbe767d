//! The node's data directory: its identity file and its process lock.
//!
//! A data directory belongs to one node of one cluster. Starting on a directory of another
//! cluster or node id, or one already in use by a running process, must fail at once with a
//! message that says what is wrong and what to do: serving from the wrong directory would make
//! the node diverge.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const IDENTITY_FILE: &str = "IDENTITY";
const LOCK_FILE: &str = "LOCK";
/// Layout version of the data directory. 10: a subscription's leases and pending redeliveries
/// are stored in blocks of 64 offsets, one key per block (`store::subs`), which an older raftq
/// cannot read (a format 4 to 9 directory's one key per offset is rewritten into blocks when
/// the state machine opens). 9: the published records of a batch are stored as one
/// run under the first one's key (`store::records`), which an older raftq cannot read (nothing
/// to change in a format 8 directory: its one key per record reads as a run of one). 8: a segment file of the Raft log is preallocated
/// whole, its frames followed by zeros (`store::segments`), which an older raftq takes for
/// damage (nothing to change in a format 7 directory: its segments open as they are, and the
/// one being appended to is given its full size). 7: the Raft log may hold batch publishes (records as
/// the Kafka record batches clients send, `state::PublishBatch`), which an older raftq cannot
/// read (nothing to change in a format 6 directory). 6: a published record is stored as where the Raft
/// log holds it (`store::records`), and the log keeps the entries records point into (nothing
/// to change in a format 5 directory, but an older raftq could not read such records). 5: the
/// Raft log's entries are in segment files of their own (`log/`, `store::segments`), no longer
/// in RocksDB's `log` family. 4: a subscription's leases and pending redeliveries are stored
/// one key each beside it (`store::subs`). 3: every stored value carries a format byte
/// (`store::values`). 2: topics, subscriptions and producers are stored behind a format byte,
/// with report counters (1 had neither; no release wrote it).
pub const FORMAT_VERSION: u32 = 10;
/// The oldest layout this raftq upgrades: its `IDENTITY` is rewritten at once, before the
/// database is opened (which upgrades the values; then the log's entries move into segment
/// files, and the state machine's opening splits the subscriptions), so an older raftq refuses the directory from then on instead of misreading
/// it.
const OLDEST_UPGRADABLE: u32 = 2;

/// What the `IDENTITY` file records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub cluster_id: String,
    pub node_id: u64,
    pub format: u32,
}

impl Identity {
    fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// An opened, locked data directory. The lock is held while this value lives.
#[derive(Debug)]
pub struct DataDir {
    root: PathBuf,
    /// Holds the `flock`; closing the file (on drop or process death) releases it.
    _lock: File,
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data directory {path} is already in use by another raftq process (its LOCK is held); \
         stop that process or choose another --data directory"
    )]
    InUse { path: PathBuf },
    #[error(
        "data directory {path} belongs to node {found_node} of cluster {found_cluster:?}, but this \
         node was started as node {node} of cluster {cluster:?}; start it with the matching --id \
         and --cluster-id, or give it an empty --data directory"
    )]
    Foreign {
        path: PathBuf,
        found_cluster: String,
        found_node: u64,
        cluster: String,
        node: u64,
    },
    #[error(
        "data directory {path} has an unreadable IDENTITY file ({detail}); it is corrupt or not a \
         raftq directory: move it aside and start with an empty --data directory"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "data directory {path} has format {found}, this raftq understands formats \
         {OLDEST_UPGRADABLE} to {FORMAT_VERSION}; run a raftq release that matches it"
    )]
    Format { path: PathBuf, found: u32 },
    #[error(
        "data directory {path} holds files but no IDENTITY; it is not a raftq data directory \
         (or is damaged): choose an empty --data directory"
    )]
    NotRaftq { path: PathBuf },
}

impl DataDir {
    /// Opens `root` for node `node_id` of `cluster_id`: creates it when absent, locks it,
    /// and checks (or, when new, writes) its identity.
    pub fn open(root: &Path, cluster_id: &str, node_id: u64) -> Result<DataDir, DataDirError> {
        let io = |source| DataDirError::Io {
            path: root.to_path_buf(),
            source,
        };
        fs::create_dir_all(root).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(LOCK_FILE))
            .map_err(io)?;
        // SAFETY: flock on a valid, owned file descriptor.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(if err.kind() == std::io::ErrorKind::WouldBlock {
                DataDirError::InUse {
                    path: root.to_path_buf(),
                }
            } else {
                io(err)
            });
        }
        let want = Identity {
            cluster_id: cluster_id.to_string(),
            node_id,
            format: FORMAT_VERSION,
        };
        let id_path = root.join(IDENTITY_FILE);
        match fs::read(&id_path) {
            Ok(bytes) => {
                let found: Identity = std::str::from_utf8(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|s| toml::from_str(s).map_err(|e| e.to_string()))
                    .map_err(|detail| DataDirError::Corrupt {
                        path: root.to_path_buf(),
                        detail,
                    })?;
                if !(OLDEST_UPGRADABLE..=FORMAT_VERSION).contains(&found.format) {
                    return Err(DataDirError::Format {
                        path: root.to_path_buf(),
                        found: found.format,
                    });
                }
                if found.cluster_id != want.cluster_id || found.node_id != want.node_id {
                    return Err(DataDirError::Foreign {
                        path: root.to_path_buf(),
                        found_cluster: found.cluster_id,
                        found_node: found.node_id,
                        cluster: want.cluster_id,
                        node: want.node_id,
                    });
                }
                if found.format < FORMAT_VERSION {
                    write_durably(root, IDENTITY_FILE, want.to_toml().as_bytes()).map_err(io)?;
                    tracing::info!(
                        from = found.format,
                        to = FORMAT_VERSION,
                        "data directory format upgraded"
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let others = fs::read_dir(root)
                    .map_err(io)?
                    .filter_map(Result::ok)
                    .any(|e| e.file_name() != LOCK_FILE);
                if others {
                    return Err(DataDirError::NotRaftq {
                        path: root.to_path_buf(),
                    });
                }
                write_durably(root, IDENTITY_FILE, want.to_toml().as_bytes()).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        Ok(DataDir {
            root: root.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where RocksDB lives.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("db")
    }

    /// Where the Raft log's segment files live.
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    /// Where snapshot files live.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Moves the node's store (the database, the log, snapshots and watermark) aside into
    /// `damaged-<ms since the epoch>/`, durably, so the node can start again from an empty one
    /// while the damaged store is kept for inspection. The database must be closed. Returns
    /// where it went (`None` when there was nothing to move).
    pub fn set_aside(&self) -> std::io::Result<Option<PathBuf>> {
        let parts = ["db", "log", "snapshots", super::watermark::FILE];
        if !parts.iter().any(|p| self.root.join(p).exists()) {
            return Ok(None);
        }
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let aside = self.root.join(format!("damaged-{millis}"));
        fs::create_dir(&aside)?;
        for part in parts {
            let from = self.root.join(part);
            if from.exists() {
                fs::rename(&from, aside.join(part))?;
            }
        }
        sync_dir(&aside)?;
        sync_dir(&self.root)?;
        Ok(Some(aside))
    }
}

/// Writes `name` in `dir` so that a crash leaves either no file or the whole file:
/// temp file, fsync, rename, fsync of the directory.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// fsyncs a directory so that renames and creations in it are durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_written_then_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("n1");
        let d = DataDir::open(&dir, "c1", 1).unwrap();
        assert!(dir.join(IDENTITY_FILE).exists());
        drop(d);
        // Same identity reopens.
        drop(DataDir::open(&dir, "c1", 1).unwrap());
        let err = DataDir::open(&dir, "c1", 2).unwrap_err();
        assert!(
            matches!(
                err,
                DataDirError::Foreign {
                    found_node: 1,
                    node: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("belongs to node 1"));
        let err = DataDir::open(&dir, "other", 1).unwrap_err();
        assert!(matches!(err, DataDirError::Foreign { .. }), "{err}");
    }

    #[test]
    fn in_use_is_refused_while_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let held = DataDir::open(tmp.path(), "c", 1).unwrap();
        let err = DataDir::open(tmp.path(), "c", 1).unwrap_err();
        assert!(matches!(err, DataDirError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("already in use"));
        drop(held);
        DataDir::open(tmp.path(), "c", 1).unwrap();
    }

    #[test]
    fn corrupt_and_foreign_directories_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("IDENTITY"), b"\xff\xfe garbage").unwrap();
        let err = DataDir::open(tmp.path(), "c", 1).unwrap_err();
        assert!(matches!(err, DataDirError::Corrupt { .. }), "{err}");

        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join("something.txt"), b"not ours").unwrap();
        let err = DataDir::open(other.path(), "c", 1).unwrap_err();
        assert!(matches!(err, DataDirError::NotRaftq { .. }), "{err}");

        let newer = tempfile::tempdir().unwrap();
        fs::write(
            newer.path().join("IDENTITY"),
            "cluster_id = \"c\"\nnode_id = 1\nformat = 99\n",
        )
        .unwrap();
        let err = DataDir::open(newer.path(), "c", 1).unwrap_err();
        assert!(
            matches!(err, DataDirError::Format { found: 99, .. }),
            "{err}"
        );
    }

    /// A format 2 to 9 directory opens and is format 10 from then on; format 1, which no
    /// release wrote, is refused.
    #[test]
    fn format_2_to_9_directories_are_upgraded_and_format_1_refused() {
        let identity =
            |format: u32| format!("cluster_id = \"c\"\nnode_id = 1\nformat = {format}\n");
        for format in [2, 3, 4, 5, 6, 7, 8, 9] {
            let tmp = tempfile::tempdir().unwrap();
            fs::write(tmp.path().join("IDENTITY"), identity(format)).unwrap();
            drop(DataDir::open(tmp.path(), "c", 1).unwrap());
            let found: Identity =
                toml::from_str(&fs::read_to_string(tmp.path().join("IDENTITY")).unwrap()).unwrap();
            assert_eq!(found.format, FORMAT_VERSION);
        }
        assert_eq!(FORMAT_VERSION, 10);

        let old = tempfile::tempdir().unwrap();
        fs::write(old.path().join("IDENTITY"), identity(1)).unwrap();
        let err = DataDir::open(old.path(), "c", 1).unwrap_err();
        assert!(
            matches!(err, DataDirError::Format { found: 1, .. }),
            "{err}"
        );
    }
}
