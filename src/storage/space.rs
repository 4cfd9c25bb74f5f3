//! Free space on the data directory's filesystem.
//!
//! RocksDB that meets a full disk stops taking writes, and openraft stops
//! its core on the first storage error it sees: the node would need a
//! restart once space is back. Checking before a write is proposed (on the
//! leader) and before log entries are accepted (on a follower) keeps the
//! node out of that state: it refuses with a clear answer while the disk is
//! short, and writes again by itself as soon as space is freed. The reserve
//! leaves RocksDB room to flush and compact what it already holds.

use std::path::{Path, PathBuf};

/// Default reserve: twice the default WAL bound (a restart's flush of it,
/// and compactions' slack).
pub const DEFAULT_RESERVE_BYTES: u64 = 64 << 20;

/// Room a restarting node needs besides its WAL's flush: RocksDB's options
/// file, manifest and a new WAL.
const RESTART_SLACK_BYTES: u64 = 4 << 20;

/// The free-space check of one data directory.
#[derive(Debug, Clone)]
pub struct DiskSpace {
    dir: PathBuf,
    reserve: u64,
    restart_need: u64,
}

/// The filesystem has less free space than the reserve.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the data directory's filesystem has {available} bytes free, below the {reserve}-byte reserve; \
     free space or grow the volume (writes resume by themselves)"
)]
pub struct NoSpace {
    pub available: u64,
    pub reserve: u64,
}

impl DiskSpace {
    /// `reserve` 0 turns the check off; `max_wal_bytes` is what a restart
    /// may write before the node serves.
    pub fn new(dir: &Path, reserve: u64, max_wal_bytes: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            reserve,
            restart_need: max_wal_bytes + RESTART_SLACK_BYTES,
        }
    }

    /// Bytes an unprivileged writer may still use on the filesystem.
    pub fn available(&self) -> std::io::Result<u64> {
        let s = rustix::fs::statvfs(&self.dir)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// Whether a restarted node could open its database (flush its WAL),
    /// even with the reserve turned off.
    pub fn has_room_to_restart(&self) -> bool {
        self.available()
            .map(|a| a >= self.reserve.max(self.restart_need))
            .unwrap_or(true)
    }

    /// Fails while the free space is below the reserve. A filesystem that
    /// cannot be asked passes: the write then meets the real error, if any.
    pub fn check(&self) -> Result<(), NoSpace> {
        if self.reserve == 0 {
            return Ok(());
        }
        match self.available() {
            Ok(available) if available < self.reserve => Err(NoSpace {
                available,
                reserve: self.reserve,
            }),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, dir = %self.dir.display(), "statvfs failed");
                Ok(())
            }
        }
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
}
