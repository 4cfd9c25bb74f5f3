//! Snapshots as RocksDB checkpoints.
//!
//! The state machine is durable by itself, so a Raft snapshot only has to
//! bound the log and, now and then, bring a follower up that the log no
//! longer can. Writing the whole state out every time one is built made its
//! cost grow with the directory (every record, change and audit entry
//! copied, 2 GB at a million agents). A build now makes a checkpoint of the
//! database instead — its memtables flushed and its table files hard-linked
//! into a directory of the snapshot's own, a consistent copy that costs no
//! more than the flush — and the current snapshot file holds only the
//! snapshot's metadata and a marker naming that directory. The document a
//! follower installs is written from the checkpoint only when one is sent
//! (`materialised`), off the state machine's path.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use rocksdb::{Options, DB};

use super::StorageError;

/// What a snapshot file's bytes start with when they name a checkpoint
/// instead of holding the document (which starts with `{`).
const MARKER: &[u8] = b"@checkpoint ";

/// The name prefix of checkpoint directories in the snapshot directory.
const PREFIX: &str = "checkpoint-";

/// Held to open a checkpoint (shared) and to remove one (exclusive): a
/// checkpoint opened has all its files open, so removing it afterwards does
/// not disturb whoever reads it, but removing it while it is being opened
/// would.
static OPENING: RwLock<()> = RwLock::new(());

/// Makes a checkpoint of `db` in a new directory under `snapshot_dir`.
pub(super) fn create(db: &DB, snapshot_dir: &Path) -> Result<PathBuf, StorageError> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = snapshot_dir.join(format!("{PREFIX}{stamp}-{n}"));
    rocksdb::checkpoint::Checkpoint::new(db)?.create_checkpoint(&dir)?;
    Ok(dir)
}

/// Opens the checkpoint in `dir` to read. `whole`: every table file is
/// opened now, so the directory may be removed while the reader still uses
/// it (otherwise tables are opened as reads reach them, which is cheaper
/// for a few keys).
pub(super) fn open(dir: &Path, whole: bool) -> Result<DB, StorageError> {
    let _opening = OPENING.read().unwrap_or_else(|e| e.into_inner());
    let mut opts = Options::default();
    // RocksDB's default already opens every table at once (-1); a reader
    // of a few keys keeps a small table cache instead, or a checkpoint of
    // a large directory would cost opening hundreds of tables each build.
    opts.set_max_open_files(if whole { -1 } else { 16 });
    let names = DB::list_cf(&opts, dir)?;
    Ok(DB::open_cf_for_read_only(&opts, dir, names, false)?)
}

/// Removes every checkpoint directory under `snapshot_dir` but `keep`. One
/// that cannot be removed is logged and left: it costs disk, and failing
/// the snapshot for it would stop Raft.
pub(super) fn remove_others(snapshot_dir: &Path, keep: Option<&Path>) -> Result<(), StorageError> {
    let _removing = OPENING.write().unwrap_or_else(|e| e.into_inner());
    for entry in std::fs::read_dir(snapshot_dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with(PREFIX) && Some(path.as_path()) != keep {
            if let Err(e) = std::fs::remove_dir_all(&path) {
                tracing::warn!(checkpoint = %path.display(), error = %e, "an old snapshot checkpoint could not be removed");
            }
        }
    }
    Ok(())
}

/// Writes the marker naming the checkpoint in `dir`.
pub(super) fn write_marker(out: &mut impl Write, dir: &Path) -> Result<(), StorageError> {
    let path = dir.to_str().ok_or_else(|| {
        StorageError::Format(format!("snapshot directory {} is not UTF-8", dir.display()))
    })?;
    out.write_all(MARKER)?;
    out.write_all(path.as_bytes())?;
    Ok(())
}

/// The checkpoint directory named by the bytes from `file`'s position on,
/// if they are a marker; `file` is left where it was.
pub(super) fn named_by(file: &mut File) -> Result<Option<PathBuf>, StorageError> {
    let start = file.stream_position()?;
    let mut head = Vec::with_capacity(MARKER.len());
    Read::by_ref(file)
        .take(MARKER.len() as u64)
        .read_to_end(&mut head)?;
    let named = if head == MARKER {
        let mut path = String::new();
        file.read_to_string(&mut path).map_err(|_| {
            StorageError::Format("a snapshot names a directory that is not UTF-8".into())
        })?;
        Some(PathBuf::from(path))
    } else {
        None
    };
    file.seek(SeekFrom::Start(start))?;
    Ok(named)
}

/// A new file in `dir`, unlinked as soon as it is created: it lives only
/// as long as its handle, so a transfer that fails or a stopped process
/// leaves nothing behind.
pub(super) fn unlinked_file(dir: &Path, kind: &str) -> std::io::Result<File> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{kind}-{n}.tmp"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// The snapshot document that the bytes from `file`'s position on stand
/// for: those bytes when they are the document, or, when they name a
/// checkpoint, the document written from it into a new unlinked file (its
/// size the checkpoint's state, which is why this is done only to send or
/// install a snapshot). The file returned is positioned at the document.
pub(super) fn materialised(
    mut file: File,
    write_document: impl FnOnce(&DB, &mut std::io::BufWriter<File>) -> Result<(), StorageError>,
) -> Result<File, StorageError> {
    let Some(dir) = named_by(&mut file)? else {
        return Ok(file);
    };
    let db = open(&dir, true)?;
    let out = unlinked_file(dir.parent().unwrap_or(Path::new(".")), "outgoing")?;
    let mut writer = std::io::BufWriter::new(out);
    write_document(&db, &mut writer)?;
    let mut out = writer.into_inner().map_err(|e| e.into_error())?;
    out.seek(SeekFrom::Start(0))?;
    Ok(out)
}

/// Snapshot documents being sent, by the checkpoint they were written from:
/// followers that need a snapshot at the same time (two nodes added at
/// once, or both back from a long outage) share one document instead of
/// each having its own written, as large as the whole state.
static OUTGOING: Mutex<Vec<(PathBuf, Weak<Written>)>> = Mutex::new(Vec::new());

/// One checkpoint's document, once the first send that needs it has
/// written it; it lives as long as a send holds it.
type Written = Mutex<Option<Arc<File>>>;

/// A snapshot document to send: read by position (`FileExt::read_at`),
/// since other sends may read the same file at once.
#[derive(Clone)]
pub struct Outgoing {
    file: Arc<File>,
    /// Where the document starts in `file`.
    start: u64,
    /// Keeps a document written from a checkpoint findable by later sends.
    _shared: Option<Arc<Written>>,
}

impl Outgoing {
    /// The document's size in bytes.
    pub fn size(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len().saturating_sub(self.start))
    }

    /// Reads up to `max` bytes of the document from `offset` on; none at
    /// its end.
    pub fn read(&self, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut data = vec![0; max];
        let mut filled = 0;
        while filled < max {
            match self
                .file
                .read_at(&mut data[filled..], self.start + offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        data.truncate(filled);
        Ok(data)
    }
}

/// [`materialised`] for sending: the document written from a checkpoint
/// is shared by the sends of that checkpoint that overlap.
pub(super) fn outgoing(
    mut file: File,
    write_document: impl FnOnce(&DB, &mut std::io::BufWriter<File>) -> Result<(), StorageError>,
) -> Result<Outgoing, StorageError> {
    let Some(dir) = named_by(&mut file)? else {
        let start = file.stream_position()?;
        let file = Arc::new(file);
        return Ok(Outgoing {
            file,
            start,
            _shared: None,
        });
    };
    let shared = {
        let mut sending = OUTGOING.lock().unwrap_or_else(|e| e.into_inner());
        sending.retain(|(_, sent)| sent.strong_count() > 0);
        let found = sending
            .iter()
            .find(|(from, _)| *from == dir)
            .and_then(|(_, sent)| sent.upgrade());
        found.unwrap_or_else(|| {
            let shared = Arc::new(Written::default());
            sending.push((dir, Arc::downgrade(&shared)));
            shared
        })
    };
    // Held while the document is written, so a send of the same checkpoint
    // that overlaps waits for it rather than writing its own; a write that
    // failed leaves it to the next.
    let mut written = shared.lock().unwrap_or_else(|e| e.into_inner());
    let file = match &*written {
        Some(file) => file.clone(),
        None => {
            let file = Arc::new(materialised(file, write_document)?);
            *written = Some(file.clone());
            file
        }
    };
    drop(written);
    Ok(Outgoing {
        file,
        start: 0,
        _shared: Some(shared),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_names_its_directory_and_a_document_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"head").unwrap();
        write_marker(&mut f, Path::new("/data/snapshots/checkpoint-1-0")).unwrap();
        let mut f = File::open(&path).unwrap();
        f.seek(SeekFrom::Start(4)).unwrap();
        assert_eq!(
            named_by(&mut f).unwrap(),
            Some(PathBuf::from("/data/snapshots/checkpoint-1-0"))
        );
        assert_eq!(f.stream_position().unwrap(), 4);

        std::fs::write(&path, b"{\"records\":[]}").unwrap();
        let mut f = File::open(&path).unwrap();
        assert_eq!(named_by(&mut f).unwrap(), None);
        let mut doc = String::new();
        materialised(f, |_, _| panic!("a document is not written again"))
            .unwrap()
            .read_to_string(&mut doc)
            .unwrap();
        assert_eq!(doc, "{\"records\":[]}");
    }

    #[test]
    fn sends_of_a_checkpoint_that_overlap_share_one_document() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::super::open(&dir.path().join("db"), super::super::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let snaps = dir.path().join("snaps");
        std::fs::create_dir_all(&snaps).unwrap();
        let made = create(&db, &snaps).unwrap();
        let snapshot_file = || {
            let path = dir.path().join("current");
            let mut f = File::create(&path).unwrap();
            write_marker(&mut f, &made).unwrap();
            File::open(&path).unwrap()
        };
        let writes = AtomicU64::new(0);
        let send = || {
            outgoing(snapshot_file(), |_, out| {
                writes.fetch_add(1, Ordering::Relaxed);
                Ok(out.write_all(b"{\"records\":[1,2,3]}")?)
            })
            .unwrap()
        };
        let first = send();
        let second = send();
        assert_eq!(writes.load(Ordering::Relaxed), 1, "written once for both");
        assert_eq!(first.size().unwrap(), 19);
        // Each reads by position, whatever the other has read.
        assert_eq!(first.read(0, 5).unwrap(), b"{\"rec");
        assert_eq!(second.read(0, 100).unwrap(), b"{\"records\":[1,2,3]}");
        assert_eq!(first.read(5, 100).unwrap(), b"ords\":[1,2,3]}");
        assert!(first.read(19, 100).unwrap().is_empty());
        // Once both are done, a later send has it written again (the
        // document is an unlinked file that lives as long as its sends).
        drop((first, second));
        let third = send();
        assert_eq!(writes.load(Ordering::Relaxed), 2);
        assert_eq!(third.read(0, 100).unwrap(), b"{\"records\":[1,2,3]}");
        // A send whose write fails (a full disk) fails alone; the next one
        // writes the document.
        drop(third);
        let failed = outgoing(snapshot_file(), |_, _| {
            Err(StorageError::Format("no space left".into()))
        });
        assert!(failed.is_err());
        let fourth = send();
        assert_eq!(writes.load(Ordering::Relaxed), 3);
        assert_eq!(fourth.read(0, 100).unwrap(), b"{\"records\":[1,2,3]}");

        // A snapshot file that holds its document is read from its
        // position on.
        let path = dir.path().join("document");
        std::fs::write(&path, b"head{\"records\":[]}").unwrap();
        let mut f = File::open(&path).unwrap();
        f.seek(SeekFrom::Start(4)).unwrap();
        let doc = outgoing(f, |_, _| panic!("a document is not written again")).unwrap();
        assert_eq!(doc.size().unwrap(), 14);
        assert_eq!(doc.read(0, 100).unwrap(), b"{\"records\":[]}");
    }

    #[test]
    fn a_checkpoint_holds_the_state_it_was_made_at_and_survives_its_removal_once_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::super::open(&dir.path().join("db"), super::super::DEFAULT_MAX_WAL_BYTES)
            .unwrap();
        let agents = super::super::cf(&db, super::super::CF_AGENTS).unwrap();
        db.put_cf(agents, b"a", b"1").unwrap();
        let snaps = dir.path().join("snaps");
        std::fs::create_dir_all(&snaps).unwrap();
        let first = create(&db, &snaps).unwrap();
        db.put_cf(agents, b"a", b"2").unwrap();
        db.put_cf(agents, b"b", b"3").unwrap();
        let second = create(&db, &snaps).unwrap();

        let read = open(&first, true).unwrap();
        remove_others(&snaps, Some(&second)).unwrap();
        assert!(!first.exists() && second.exists());
        let cf = super::super::cf(&read, super::super::CF_AGENTS).unwrap();
        assert_eq!(read.get_cf(cf, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(read.get_cf(cf, b"b").unwrap(), None);
        let read = open(&second, false).unwrap();
        let cf = super::super::cf(&read, super::super::CF_AGENTS).unwrap();
        assert_eq!(read.get_cf(cf, b"a").unwrap().as_deref(), Some(&b"2"[..]));
    }
}
