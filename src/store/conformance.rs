//! openraft's storage conformance suite, run against our RocksDB log and state machine.

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

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
        let log = LogStore::new(db).expect("start the log store");
        Ok((dir, log, StateMachineStore::new(sm)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder).await
}
