//! The data directory's format version, in a `FORMAT` file beside the
//! database. A binary refuses a directory written by a newer format (its
//! data may mean something this binary does not know) and upgrades an
//! older one in place before it opens the database.
//!
//! Formats:
//! - 0: before the version was recorded (no `FORMAT` file).
//! - 1: the same layout, with the version recorded.
//! - 2: adds the `leases` column family (agents' holds and shared leases;
//!   created empty on open) and refresh entries in the log.
//! - 3: Raft log entries in the binary encoding (`consensus::codec`);
//!   entries written before, JSON, are still read, so the upgrade rewrites
//!   nothing.
//! - 4: batch entries in the log (`Command::Batch`, many clients' commands
//!   in one entry) and revisions kept apart from log indexes (`revision` in
//!   the state machine's metadata; absent, the last applied index stands in).
//!   Nothing is rewritten; the number keeps binaries that cannot apply a
//!   batch entry away from a log that may hold one.
//! - 5: adds the `index_vectors` column family (the discovery index's
//!   vectors, derived and local to the node, so a restart need not embed
//!   every record again; created empty on open). An older binary cannot
//!   open a database with a column family it does not know.

use std::path::Path;

use super::StorageError;

/// The format this binary writes.
pub const DATA_FORMAT: u32 = 5;

pub(super) const FORMAT_FILE: &str = "FORMAT";
const PREFIX: &str = "agentry-data-format ";

/// Reads the directory's format (a new directory takes this binary's),
/// refuses a newer one, upgrades an older one, and records the result.
pub fn check_and_upgrade(dir: &Path) -> Result<u32, StorageError> {
    let path = dir.join(FORMAT_FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .strip_prefix(PREFIX)
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                StorageError::Format(format!(
                    "{} is not a data format file ({text:?})",
                    path.display()
                ))
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.join("db").exists() {
                0
            } else {
                DATA_FORMAT
            }
        }
        Err(e) => return Err(e.into()),
    };
    if found > DATA_FORMAT {
        return Err(StorageError::Format(format!(
            "{} was written by a newer Agentry (data format {found}; this binary reads formats up to \
             {DATA_FORMAT}): run the newer binary, or restore a backup into a new directory",
            dir.display()
        )));
    }
    if found < DATA_FORMAT {
        // 0 -> 1 -> ... -> 5 change no stored data (new column families are
        // created when the database opens); later upgrades run here in order.
        tracing::info!(
            dir = %dir.display(),
            from = found,
            to = DATA_FORMAT,
            "upgrading the data directory's format"
        );
    }
    if found < DATA_FORMAT || !path.exists() {
        let tmp = dir.join("FORMAT.tmp");
        std::fs::write(&tmp, format!("{PREFIX}{DATA_FORMAT}\n"))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(DATA_FORMAT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_old_and_newer_directories() {
        let dir = tempfile::tempdir().unwrap();
        // New: recorded.
        assert_eq!(check_and_upgrade(dir.path()).unwrap(), DATA_FORMAT);
        let text = std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert_eq!(text, format!("agentry-data-format {DATA_FORMAT}\n"));
        // Old (a database, no FORMAT): upgraded.
        let old = tempfile::tempdir().unwrap();
        std::fs::create_dir(old.path().join("db")).unwrap();
        check_and_upgrade(old.path()).unwrap();
        assert!(old.path().join(FORMAT_FILE).exists());
        // Newer: refused, and left as it was.
        std::fs::write(dir.path().join(FORMAT_FILE), "agentry-data-format 99\n").unwrap();
        let e = check_and_upgrade(dir.path()).unwrap_err().to_string();
        assert!(e.contains("newer Agentry") && e.contains("99"), "{e}");
        let text = std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert_eq!(text, "agentry-data-format 99\n");
    }
}
