//! openraft's storage conformance suite, run against the real RocksDB log
//! store and state machine.

use openraft::testing::{StoreBuilder, Suite};

use super::{open, LogStore, StateMachine};
use crate::consensus::codec::Encoding;
use crate::consensus::{StorageError, TypeConfig};

/// Builds stores whose log writes `Encoding`.
struct RocksBuilder(Encoding);

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::write(&e))?;
        let db = open(dir.path(), super::DEFAULT_MAX_WAL_BYTES)
            .map_err(|e| openraft::StorageIOError::write(&e))?;
        let sm = StateMachine::open(db.clone(), dir.path().join("snapshots"), 10_000)
            .map_err(|e| openraft::StorageIOError::write(&e))?;
        Ok((
            dir,
            LogStore::new(db)
                .map_err(|e| openraft::StorageIOError::write(&e))?
                .with_encoding(self.0),
            sm,
        ))
    }
}

#[test]
fn openraft_storage_suite() {
    // The binary log, and the JSON one older versions wrote.
    for encoding in [Encoding::Binary, Encoding::Json] {
        if let Err(e) = Suite::test_all(RocksBuilder(encoding)) {
            panic!("openraft storage suite failed ({encoding:?} log): {e}");
        }
    }
}
