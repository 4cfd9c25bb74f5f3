//! Free space on the data directory's filesystem.
//!
//! RocksDB that meets a full disk stops taking writes, and openraft stops
//! its core on the first storage error it sees: the node would need a
//! restart once space is back. Checking before a write is proposed (on the
//! leader) and before log entries are accepted (on a follower) keeps the
//! node out of that state: it refuses with a clear answer while the disk is
//! short, and writes again by itself as soon as space is freed. The reserve
//! leaves RocksDB room to flush what it holds; on top of it, the check
//! keeps free what compacting the largest column family may write before
//! it deletes its inputs. Without that, a compaction (one starts right
//! after a restart, too) could take the room the next log entry needs, and
//! a node with enough free space by the reserve alone would stop its core
//! anyway.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocksdb::DB;

/// Default reserve: twice the default WAL bound (a restart's flush of it,
/// and of the state written beside it without the WAL). Compactions get
/// their room on top of it.
pub const DEFAULT_RESERVE_BYTES: u64 = 64 << 20;

/// Room a restarting node needs besides its WAL's flush: RocksDB's options
/// file, manifest and a new WAL.
const RESTART_SLACK_BYTES: u64 = 4 << 20;

/// How long a reading of the database's table sizes is used: the check
/// runs on every write, the sizes change by a flush or a compaction.
const HEADROOM_READ_EVERY: Duration = Duration::from_secs(1);

/// The free-space check of one data directory.
#[derive(Debug, Clone)]
pub struct DiskSpace {
    dir: PathBuf,
    reserve: u64,
    restart_need: u64,
    /// The database whose compactions need room, once it is open.
    db: Option<Arc<DB>>,
    /// The last reading of that room, and when it was taken.
    headroom: Arc<Mutex<Option<(Instant, u64)>>>,
}

/// What the check compares, for the metrics page: an operator alerts on
/// free space nearing what is kept free before writes are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceStats {
    /// None when the filesystem cannot be asked.
    pub available: Option<u64>,
    pub compaction_headroom: u64,
    /// Free bytes below which writes are refused; 0 with the check off.
    pub kept_free: u64,
}

/// The filesystem has less free space than the reserve and the room for
/// compactions.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the data directory's filesystem has {available} bytes free, below the {reserve}-byte reserve \
     plus the {compaction} bytes that compacting its largest table set may take; free space or \
     grow the volume (writes resume by themselves)"
)]
pub struct NoSpace {
    pub available: u64,
    pub reserve: u64,
    pub compaction: u64,
}

impl DiskSpace {
    /// `reserve` 0 turns the check off; `max_wal_bytes` is what a restart
    /// may write before the node serves.
    pub fn new(dir: &Path, reserve: u64, max_wal_bytes: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            reserve,
            restart_need: max_wal_bytes + RESTART_SLACK_BYTES,
            db: None,
            headroom: Arc::default(),
        }
    }

    /// Keeps room for `db`'s compactions on top of the reserve.
    pub fn with_database(mut self, db: Arc<DB>) -> Self {
        self.db = Some(db);
        self
    }

    /// What compacting the largest column family may write before it
    /// deletes its inputs; 0 before the database is open.
    pub fn compaction_headroom(&self) -> u64 {
        let Some(db) = &self.db else { return 0 };
        let mut last = self.headroom.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some((at, bytes)) if at.elapsed() < HEADROOM_READ_EVERY => bytes,
            _ => {
                let bytes = super::compaction_headroom(db);
                *last = Some((Instant::now(), bytes));
                bytes
            }
        }
    }

    /// Bytes an unprivileged writer may still use on the filesystem.
    pub fn available(&self) -> std::io::Result<u64> {
        let s = rustix::fs::statvfs(&self.dir)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// The free space and what the check keeps free.
    pub fn stats(&self) -> SpaceStats {
        let compaction_headroom = self.compaction_headroom();
        SpaceStats {
            available: self.available().ok(),
            compaction_headroom,
            kept_free: self.kept_free(compaction_headroom),
        }
    }

    /// The reserve and the room for compactions; 0 with the check off.
    fn kept_free(&self, compaction_headroom: u64) -> u64 {
        match self.reserve {
            0 => 0,
            reserve => reserve.saturating_add(compaction_headroom),
        }
    }

    /// Whether a restarted node could open its database (flush its WAL),
    /// even with the reserve turned off, and then pass [`Self::check`].
    pub fn has_room_to_restart(&self) -> bool {
        let kept = self.kept_free(self.compaction_headroom());
        self.available()
            .map(|a| a >= kept.max(self.restart_need))
            .unwrap_or(true)
    }

    /// Fails while the free space is below the reserve and the room for
    /// compactions. A filesystem that cannot be asked passes: the write
    /// then meets the real error, if any.
    pub fn check(&self) -> Result<(), NoSpace> {
        if self.reserve == 0 {
            return Ok(());
        }
        match self.available() {
            Ok(available) => self.short_of(available).map_or(Ok(()), Err),
            Err(e) => {
                tracing::debug!(error = %e, dir = %self.dir.display(), "statvfs failed");
                Ok(())
            }
        }
    }

    /// Why `available` free bytes are too few for a write, if they are.
    fn short_of(&self, available: u64) -> Option<NoSpace> {
        let compaction = self.compaction_headroom();
        (available < self.kept_free(compaction)).then_some(NoSpace {
            available,
            reserve: self.reserve,
            compaction,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_above_the_free_space_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let free = DiskSpace::new(dir.path(), 1, 0).available().unwrap();
        assert!(free > 0);
        assert!(DiskSpace::new(dir.path(), 1, 0).check().is_ok());
        assert!(DiskSpace::new(dir.path(), 0, 0).check().is_ok());
        let e = DiskSpace::new(dir.path(), u64::MAX, 0).check().unwrap_err();
        assert_eq!(e.reserve, u64::MAX);
        assert!(e.to_string().contains("free space"), "{e}");
    }

    /// A database's largest column family is kept free on top of the
    /// reserve: compacting it may rewrite all of it first.
    #[test]
    fn room_for_compacting_the_largest_column_family_is_kept_too() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::storage::open(&dir.path().join("data"), 1 << 20).unwrap();
        let agents = crate::storage::cf(&db, crate::storage::CF_AGENTS).unwrap();
        let value = vec![b'x'; 64 << 10];
        for i in 0u32..64 {
            db.put_cf(agents, i.to_be_bytes(), &value).unwrap();
        }
        db.flush_cf(agents).unwrap();

        let alone = DiskSpace::new(dir.path(), u64::MAX / 2, 0);
        assert_eq!(alone.compaction_headroom(), 0);
        let space = alone.with_database(db.clone());
        let headroom = space.compaction_headroom();
        assert!(headroom >= (64 * 64) << 10, "{headroom}");
        let e = space.check().unwrap_err();
        assert_eq!((e.reserve, e.compaction), (u64::MAX / 2, headroom));
        assert!(
            e.to_string().contains(&format!("the {headroom} bytes")),
            "{e}"
        );

        // Enough for the reserve alone is refused; with the room for
        // compaction too it passes.
        let space = DiskSpace::new(dir.path(), 1 << 20, 0).with_database(db.clone());
        assert!(space.short_of(1 << 20).is_some());
        assert!(space.short_of((1 << 20) + headroom - 1).is_some());
        assert!(space.short_of((1 << 20) + headroom).is_none());
        let free = space.available().unwrap();
        let fits = DiskSpace::new(dir.path(), free / 2, 0).with_database(db);
        assert!(fits.check().is_ok());
        assert!(fits.has_room_to_restart());
    }
}
