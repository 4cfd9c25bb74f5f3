//! The audit trail's JSON-lines copy for a SIEM (`[audit] file`). One
//! thread appends every entry the node records. It keeps the file bounded
//! the way Consul's audit sink and the Kubernetes API server's audit log
//! do, by rotating it at a size and keeping a number of rotated files, and
//! it follows a rotation made by someone else: when the path no longer
//! names the file being written (logrotate's move-and-create, or the file
//! deleted), the path is opened again, and a file truncated in place
//! (logrotate's `copytruncate`) is measured again. Lines never hold up a
//! request: a writer that falls behind, or cannot write, drops them and
//! counts them (`agentry_audit_file_dropped_lines_total`).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::domain::audit::AuditEntry;

/// Lines waiting for the writer; past this a line is dropped.
const QUEUE: usize = 4096;
/// Most lines taken from the queue for one write.
const BATCH: usize = 256;
/// A failing file is reported at most this often (with the lines lost).
const WARN_EVERY: Duration = Duration::from_secs(60);
/// A new file's mode: the trail names principals and client addresses.
const NEW_FILE_MODE: u32 = 0o600;

/// When the file is rotated, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// A line that would take the file past this size starts a new one
    /// (a longer line gets a file of its own); 0: never rotated.
    pub max_bytes: u64,
    /// Rotated files kept, the oldest deleted first; 0: all of them.
    pub max_files: usize,
}

/// Where the node's trails send entries for the file.
#[derive(Clone, Debug)]
pub struct AuditSink(mpsc::Sender<AuditEntry>);

impl AuditSink {
    /// Queues `entry` for the file without waiting: a writer `QUEUE` lines
    /// behind loses the line (the database keeps the entry), never the
    /// request.
    pub fn send(&self, entry: AuditEntry) {
        if self.0.try_send(entry).is_err() {
            crate::metrics::observe_audit_lines_dropped("behind", 1);
        }
    }
}

/// Opens (or creates) `path` and starts its writer. Fails when the file
/// cannot be opened, so a node with a wrong path does not start.
pub fn open(path: PathBuf, rotation: Rotation) -> io::Result<AuditSink> {
    let mut writer = Writer::new(path, rotation);
    writer.current()?;
    // At zero from the start, so the first loss is an increase an alert
    // sees.
    for reason in ["write_failed", "behind"] {
        crate::metrics::observe_audit_lines_dropped(reason, 0);
    }
    let (tx, mut rx) = mpsc::channel::<AuditEntry>(QUEUE);
    std::thread::Builder::new()
        .name("audit-file".into())
        .spawn(move || {
            let mut lines = Vec::with_capacity(BATCH);
            while let Some(first) = rx.blocking_recv() {
                lines.clear();
                lines.push(line(&first));
                while lines.len() < BATCH {
                    match rx.try_recv() {
                        Ok(e) => lines.push(line(&e)),
                        Err(_) => break,
                    }
                }
                writer.write(&lines);
            }
        })?;
    Ok(AuditSink(tx))
}

/// Whether [`open`] would find room for the trail at `path`, without
/// creating anything: the file opens for appending, or the directory it
/// would be made in exists (`agentry serve --check-config`).
pub fn check(path: &Path) -> io::Result<()> {
    if path.exists() {
        return OpenOptions::new().append(true).open(path).map(drop);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if std::fs::metadata(dir)?.is_dir() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        ))
    }
}

fn line(entry: &AuditEntry) -> Vec<u8> {
    let mut line = serde_json::to_vec(entry).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The file being written, as it was when opened.
struct Open {
    file: File,
    size: u64,
    dev: u64,
    ino: u64,
}

struct Writer {
    path: PathBuf,
    rotation: Rotation,
    file: Option<Open>,
    /// The mode of the last file written, given to the next one, so an
    /// operator's `chmod` outlives rotations.
    mode: u32,
    /// Lines lost since the file last took a write.
    lost: u64,
    /// A rotation failed during this batch: the rest goes to the file as
    /// it is, so a directory the node may not rename in costs one attempt
    /// a batch, not one a line.
    rotation_failed: bool,
    last_warning: Option<Instant>,
}

impl Writer {
    fn new(path: PathBuf, rotation: Rotation) -> Self {
        Self {
            path,
            rotation,
            file: None,
            mode: NEW_FILE_MODE,
            lost: 0,
            rotation_failed: false,
            last_warning: None,
        }
    }

    /// Appends `lines`, rotating where they reach the size. A failure loses
    /// the lines not yet written, and the file is opened again for the
    /// next batch.
    fn write(&mut self, lines: &[Vec<u8>]) {
        self.follow_path();
        self.rotation_failed = false;
        let mut at = 0;
        while at < lines.len() {
            match self.write_some(&lines[at..]) {
                Ok(n) => at += n,
                Err(err) => {
                    self.failed(&err, lines.len() - at);
                    return;
                }
            }
        }
        if self.lost > 0 {
            tracing::info!(
                path = %self.path.display(),
                lines_lost = self.lost,
                "audit file written again"
            );
            self.lost = 0;
            self.last_warning = None;
        }
    }

    /// Drops the open file when the path names another file or none (it
    /// was moved or deleted), and takes the size again when it is the same
    /// file (it may have been truncated).
    fn follow_path(&mut self) {
        let Some(open) = &mut self.file else {
            return;
        };
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.dev() == open.dev && meta.ino() == open.ino => {
                open.size = meta.len();
            }
            _ => {
                tracing::info!(path = %self.path.display(), "audit file moved away: opening the path again");
                self.close();
            }
        }
    }

    /// Writes the lines that fit in the current file (at least one), after
    /// a rotation when the first does not fit; the number written.
    fn write_some(&mut self, lines: &[Vec<u8>]) -> io::Result<usize> {
        let max = self.rotation.max_bytes;
        let first = lines.first().map_or(0, |l| l.len() as u64);
        let size = self.current()?.size;
        if max > 0 && size > 0 && size + first > max && !self.rotation_failed {
            self.rotate();
        }
        let max = if self.rotation_failed { 0 } else { max };
        let open = self.current()?;
        let mut buf = Vec::new();
        let mut size = open.size;
        let mut n = 0;
        for l in lines {
            let len = l.len() as u64;
            if n > 0 && max > 0 && size + len > max {
                break;
            }
            buf.extend_from_slice(l);
            size += len;
            n += 1;
        }
        if let Err(err) = open.file.write_all(&buf) {
            // A line cut short (a full disk) would be one a SIEM cannot
            // read: take the file back to its last whole line.
            let _ = open.file.set_len(open.size);
            self.close();
            return Err(err);
        }
        open.size = size;
        Ok(n)
    }

    /// Closes the file, keeping its mode (as it is now) for the next.
    fn close(&mut self) {
        if let Some(open) = self.file.take() {
            if let Ok(meta) = open.file.metadata() {
                self.mode = meta.mode() & 0o7777;
            }
        }
    }

    /// The open file, opening the path (creating it) if none is.
    fn current(&mut self) -> io::Result<&mut Open> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(self.mode)
                .open(&self.path)?;
            let meta = file.metadata()?;
            self.file = Some(Open {
                file,
                size: meta.len(),
                dev: meta.dev(),
                ino: meta.ino(),
            });
        }
        match &mut self.file {
            Some(open) => Ok(open),
            None => Err(io::Error::other("audit file not open")),
        }
    }

    /// Renames the file to `<name>.<UTC time>` and deletes the oldest
    /// rotated files past `max_files`. A rename that fails keeps the batch
    /// going to the file as it is, past its size, rather than losing it;
    /// the next batch tries again.
    fn rotate(&mut self) {
        let renamed = rotated_files(&self.path).and_then(|mut kept| {
            let target = rotated_path(&self.path, time::OffsetDateTime::now_utc(), &kept);
            std::fs::rename(&self.path, &target)?;
            kept.push(target);
            Ok(kept)
        });
        let rotated = match renamed {
            Ok(rotated) => rotated,
            Err(err) => {
                self.rotation_failed = true;
                self.warn(
                    &err,
                    "audit file could not be rotated; it grows past max_bytes",
                );
                return;
            }
        };
        self.close();
        if let Err(err) = self.prune(rotated) {
            self.warn(&err, "old audit files could not be deleted");
        }
    }

    /// Deletes the oldest of `rotated` (the directory's rotated files, as
    /// listed for the rotation) past `max_files`.
    fn prune(&self, mut rotated: Vec<PathBuf>) -> io::Result<()> {
        if self.rotation.max_files == 0 {
            return Ok(());
        }
        let excess = rotated.len().saturating_sub(self.rotation.max_files);
        rotated.sort();
        for old in rotated.into_iter().take(excess) {
            std::fs::remove_file(old)?;
        }
        Ok(())
    }

    fn failed(&mut self, err: &io::Error, lost: usize) {
        crate::metrics::observe_audit_lines_dropped("write_failed", lost as u64);
        self.lost += lost as u64;
        self.warn(
            err,
            "audit file write failed; lines are dropped until it can be written",
        );
    }

    fn warn(&mut self, err: &io::Error, what: &str) {
        if self
            .last_warning
            .is_some_and(|at| at.elapsed() < WARN_EVERY)
        {
            return;
        }
        self.last_warning = Some(Instant::now());
        tracing::warn!(path = %self.path.display(), error = %err, lines_lost = self.lost, "{what}");
    }
}

/// `<path>.<YYYY-MM-DDTHH-MM-SS.mmmZ>`, numbered `-0001` on when `kept`
/// (the rotated files there) has that time already: each number past the
/// highest kept, so names sort by age even after the oldest are deleted.
fn rotated_path(path: &Path, at: time::OffsetDateTime, kept: &[PathBuf]) -> PathBuf {
    let stamp = format!(
        "{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    );
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".");
    name.push(&stamp);
    let same_time = kept.iter().filter_map(|k| {
        let rest = k
            .file_name()?
            .as_encoded_bytes()
            .strip_prefix(name.as_encoded_bytes())?;
        match rest {
            [] => Some(0),
            [b'-', number @ ..] => std::str::from_utf8(number).ok()?.parse::<u32>().ok(),
            _ => None,
        }
    });
    if let Some(highest) = same_time.max() {
        name.push(format!("-{:04}", highest + 1));
    }
    path.with_file_name(name)
}

/// The rotated files of `path` in its directory (names this writer gives,
/// nothing else).
fn rotated_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(file) = entry.file_name().into_string() else {
            continue;
        };
        if file.strip_prefix(&prefix).is_some_and(is_stamp) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

/// Whether `s` is a stamp `rotated_path` writes.
fn is_stamp(s: &str) -> bool {
    let (stamp, number) = match s.split_once("Z-") {
        Some((stamp, n)) => (stamp, Some(n)),
        None => match s.strip_suffix('Z') {
            Some(stamp) => (stamp, None),
            None => return false,
        },
    };
    let shape = "0000-00-00T00-00-00.000";
    stamp.len() == shape.len()
        && stamp.bytes().zip(shape.bytes()).all(|(c, s)| {
            if s == b'0' {
                c.is_ascii_digit()
            } else {
                c == s
            }
        })
        && number.is_none_or(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn lines(from: usize, to: usize) -> Vec<Vec<u8>> {
        (from..to)
            .map(|i| format!("{{\"seq\":{i:04},\"pad\":\"{}\"}}\n", "x".repeat(80)).into_bytes())
            .collect()
    }

    fn writer(path: &Path, max_bytes: u64, max_files: usize) -> Writer {
        Writer::new(
            path.to_path_buf(),
            Rotation {
                max_bytes,
                max_files,
            },
        )
    }

    /// Every line in the rotated files (oldest first) and then the file.
    fn written(path: &Path) -> Vec<String> {
        let mut files = rotated_files(path).unwrap();
        files.sort();
        files.push(path.to_path_buf());
        files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn rotates_at_the_size_and_keeps_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut w = writer(&path, 1000, 2);
        // 102 bytes a line: nine fit in 1,000.
        for batch in 0..10 {
            w.write(&lines(batch * 5, batch * 5 + 5));
        }
        let rotated = rotated_files(&path).unwrap();
        assert_eq!(rotated.len(), 2, "{rotated:?}");
        for f in rotated.iter().chain([&path]) {
            let len = std::fs::metadata(f).unwrap().len();
            assert!(len <= 1000, "{} is {len} bytes", f.display());
        }
        // The newest lines, whole, in order, none twice: 50 lines of 9 a
        // file are five full files and five lines, of which the two full
        // files before the last are kept.
        let expected: Vec<String> = lines(27, 50)
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap().trim_end().to_string())
            .collect();
        assert_eq!(written(&path), expected);
    }

    #[test]
    fn without_a_size_the_file_is_never_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut w = writer(&path, 0, 2);
        w.write(&lines(0, 100));
        assert!(rotated_files(&path).unwrap().is_empty());
        assert_eq!(written(&path).len(), 100);
    }

    #[test]
    fn follows_a_file_moved_away_or_truncated_and_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut w = writer(&path, 1000, 0);
        w.write(&lines(0, 2));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600, "a new file is the owner's only");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        // logrotate's move-and-create, without the create.
        let moved = dir.path().join("audit.jsonl.1");
        std::fs::rename(&path, &moved).unwrap();
        w.write(&lines(2, 3));
        assert_eq!(std::fs::read_to_string(&moved).unwrap().lines().count(), 2);
        assert_eq!(written(&path).len(), 1);
        assert_eq!(mode(&path), 0o640, "the operator's mode is kept");
        // logrotate's copytruncate: the size is taken again, so the file is
        // not rotated early.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        w.write(&lines(3, 12));
        assert_eq!(written(&path).len(), 9);
        assert!(rotated_files(&path).unwrap().is_empty());
    }

    #[test]
    fn a_file_that_cannot_be_written_loses_lines_until_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("logs");
        std::fs::create_dir(&sub).unwrap();
        let path = sub.join("audit.jsonl");
        let mut w = writer(&path, 0, 0);
        w.write(&lines(0, 1));
        std::fs::remove_dir_all(&sub).unwrap();
        w.write(&lines(1, 4));
        assert_eq!(w.lost, 3);
        assert!(w.file.is_none());
        std::fs::create_dir(&sub).unwrap();
        w.write(&lines(4, 5));
        assert_eq!(w.lost, 0);
        assert_eq!(
            written(&path),
            vec![String::from_utf8(lines(4, 5).remove(0))
                .unwrap()
                .trim_end()
                .to_string()]
        );
    }

    #[test]
    fn only_the_writers_own_names_count_as_rotated_files() {
        assert!(is_stamp("2026-12-07T15-30-00.123Z"));
        assert!(is_stamp("2026-12-07T15-30-00.123Z-0002"));
        for other in [
            "1",
            "gz",
            "2026-12-07T15-30-00.123Z.gz",
            "2026-12-07T15-30-00Z",
            "2026-12-07T15-30-00.123Z-",
            "2026-12-07T15:30:00.123Z",
        ] {
            assert!(!is_stamp(other), "{other}");
        }
        let at = time::macros::datetime!(2026-12-07 15:30:00.123 UTC);
        let path = Path::new("/nowhere/audit.jsonl");
        let first = rotated_path(path, at, &[]);
        assert_eq!(
            first,
            Path::new("/nowhere/audit.jsonl.2026-12-07T15-30-00.123Z")
        );
        // Within the same millisecond: after the highest, even when the
        // first was deleted.
        let second = rotated_path(path, at, std::slice::from_ref(&first));
        assert_eq!(
            second,
            Path::new("/nowhere/audit.jsonl.2026-12-07T15-30-00.123Z-0001")
        );
        let third = rotated_path(path, at, std::slice::from_ref(&second));
        assert_eq!(
            third,
            Path::new("/nowhere/audit.jsonl.2026-12-07T15-30-00.123Z-0002")
        );
        assert!(first < second && second < third);
    }
}
