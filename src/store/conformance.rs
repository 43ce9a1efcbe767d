//! openraft's storage conformance suite, run against our log (segment files and RocksDB) and
//! state machine.

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

use super::log::open_segments;
use super::{open_db, LogStore, SmShared, StateMachineStore};
use crate::raft::TypeConfig;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open_db(&dir.path().join("db")).expect("open db");
        let sm = SmShared::open(db.clone(), dir.path().join("snapshots")).expect("open sm");
        let segments = open_segments(&db, &dir.path().join("log"), 0).expect("open the log");
        let log = LogStore::new(db, segments).expect("start the log store");
        // The suite applies entries it never appended: the state machine does not wait for
        // the log here (the wait has its own test, in `sm_tests`).
        Ok((dir, log, StateMachineStore::without_log(sm)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder).await
}
