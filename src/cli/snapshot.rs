//! `agentry snapshot`: backups like `etcdctl snapshot` — save one online
//! through the admin API of any node, check one, and seed a new node or
//! cluster from one offline.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Subcommand};

use super::{local, CliError, ClientArgs};
use crate::pb;
use crate::storage::{self, RestoreTarget};

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take an online, consistent backup through a node's admin API (needs
    /// an admin key) and write it to FILE (mode 0600: it holds the
    /// registry's signing keys). FILE may be a directory: the backup is then
    /// named agentry-<UTC time>.backup in it (for scheduled backups).
    Save {
        file: PathBuf,
        /// With a directory: keep this many newest agentry-*.backup files
        /// in it and delete older ones once the new backup is complete.
        #[arg(long)]
        keep: Option<usize>,
        /// Offline: read the data directory of a STOPPED node instead of
        /// asking a running one (after losing quorum, to carry the
        /// survivors' state into a new cluster). No read barrier: the
        /// backup holds what that node had applied.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Check a backup's checksum and print what it holds.
    Status { file: PathBuf },
    /// Seed the data directory of a new node from a backup (offline; the
    /// directory must not exist or be empty). Restore the same file for
    /// every member of the new cluster, each with its --node-id and the
    /// same --initial-members, then start them with `agentry serve`.
    Restore {
        file: PathBuf,
        /// The new node's data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new node's id.
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// Voters of the new cluster as id=host:port (their Raft
        /// addresses), comma-separated; default: this node alone at
        /// --raft-addr.
        #[arg(long, value_delimiter = ',')]
        initial_members: Vec<String>,
        /// This node's Raft address when it is the only member.
        #[arg(long, default_value = crate::config::DEFAULT_RAFT_ADDR)]
        raft_addr: String,
    },
}

pub async fn run_snapshot(args: SnapshotArgs) -> Result<(), CliError> {
    match args.command {
        SnapshotCommand::Save {
            ref file,
            keep,
            data_dir: Some(ref data_dir),
        } => {
            if keep.is_some() {
                return Err(local("--keep is for scheduled online backups"));
            }
            save_offline(data_dir, file).await
        }
        SnapshotCommand::Save {
            ref file,
            keep,
            data_dir: None,
        } => {
            if file.is_dir() {
                // Milliseconds, so two saves in one second do not write the
                // same file; the names still sort by time.
                let name = time::OffsetDateTime::now_utc()
                    .format(time::macros::format_description!(
                        "agentry-[year][month][day]T[hour][minute][second].[subsecond digits:3]Z.backup"
                    ))
                    .map_err(local)?;
                let target = file.join(name);
                if target.exists() || target.with_extension("part").exists() {
                    return Err(local(format!(
                        "{} is being written by another save; try again",
                        target.display()
                    )));
                }
                save(&args.client, &target).await?;
                if let Some(keep) = keep {
                    prune(file, keep.max(1))?;
                }
                Ok(())
            } else if keep.is_some() {
                Err(local("--keep needs a directory to save into"))
            } else {
                save(&args.client, file).await
            }
        }
        SnapshotCommand::Status { ref file } => status(file, args.client.json),
        SnapshotCommand::Restore {
            ref file,
            ref data_dir,
            node_id,
            ref initial_members,
            ref raft_addr,
        } => {
            let mut config = crate::config::Config {
                initial_members: initial_members.clone(),
                ..Default::default()
            };
            let mut members = config.members().map_err(local)?;
            if members.is_empty() {
                members.insert(node_id, raft_addr.clone());
            }
            config.node_id = node_id;
            let target = RestoreTarget { node_id, members };
            let started = Instant::now();
            let summary = storage::restore(file, data_dir, &target, config.storage.max_wal_bytes)
                .map_err(local)?;
            println!(
                "restored {} records, {} changes, {} audit entries, {} leases and holds ({} bytes) into {} as node {node_id} of {:?}, cluster id {}, in {:.1} s",
                summary.counts.records,
                summary.counts.changes,
                summary.counts.audit,
                summary.counts.leases,
                summary.bytes,
                data_dir.display(),
                target.members.keys().collect::<Vec<_>>(),
                summary.cluster_id.unwrap_or_default(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}

/// Streams the backup into `FILE.part`, checks it, then renames it.
async fn save(client: &ClientArgs, file: &Path) -> Result<(), CliError> {
    let started = Instant::now();
    let (_, channel) = client.connect(0).await?;
    let mut stream = pb::cluster_client::ClusterClient::new(channel)
        .backup(client.request(pb::BackupRequest {})?)
        .await?
        .into_inner();
    let part = file.with_extension("part");
    let mut out = std::io::BufWriter::new(create_private(&part)?);
    let mut bytes = 0u64;
    let received = async {
        while let Some(chunk) = stream.message().await? {
            bytes += chunk.data.len() as u64;
            out.write_all(&chunk.data).map_err(local)?;
        }
        out.into_inner()
            .map_err(|e| local(e.into_error()))?
            .sync_all()
            .map_err(local)?;
        Ok::<_, CliError>(())
    }
    .await;
    let (header, end) = place(&part, file, received)?;
    println!(
        "saved {} ({bytes} bytes, sha256 {}) from node {} at index {}: {} records, {} changes, {} audit entries in {:.1} s",
        file.display(),
        end.sha256,
        header.node_id,
        header.last_applied.map(|l| l.index).unwrap_or(0),
        end.records,
        end.changes,
        end.audit,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Checks the backup just written to `part` and moves it to `file`; a
/// write or check that failed leaves no file behind.
fn place(
    part: &Path,
    file: &Path,
    written: Result<(), CliError>,
) -> Result<(storage::BackupHeader, storage::BackupEnd), CliError> {
    let checked = written.and_then(|()| {
        let reader = std::io::BufReader::new(std::fs::File::open(part).map_err(local)?);
        storage::verify_backup(reader).map_err(local)
    });
    match checked {
        Ok(v) => {
            std::fs::rename(part, file).map_err(local)?;
            Ok(v)
        }
        Err(e) => {
            let _ = std::fs::remove_file(part);
            Err(e)
        }
    }
}

/// Applies the log of the copy in `scratch` and writes its backup to `file`.
async fn save_copy(
    scratch: &Path,
    file: &Path,
) -> Result<(usize, storage::BackupHeader, storage::BackupEnd), CliError> {
    let db = storage::open(scratch, storage::DEFAULT_MAX_WAL_BYTES).map_err(local)?;
    let mut state =
        storage::StateMachine::open(db.clone(), scratch.join("snapshots"), 0).map_err(local)?;
    let replayed = storage::apply_log(db.clone(), &mut state)
        .await
        .map_err(local)?;
    let part = file.with_extension("part");
    let mut out = std::io::BufWriter::new(create_private(&part)?);
    let written = storage::write_backup(&db, 0, &mut out)
        .map_err(local)
        .and_then(|_| {
            out.into_inner()
                .map_err(|e| local(e.into_error()))?
                .sync_all()
                .map_err(local)
        });
    let (header, end) = place(&part, file, written)?;
    Ok((replayed, header, end))
}

/// Writes a backup from a stopped node's data directory.
async fn save_offline(data_dir: &Path, file: &Path) -> Result<(), CliError> {
    if !data_dir.join("db").is_dir() {
        return Err(local(format!(
            "{} holds no Agentry database",
            data_dir.display()
        )));
    }
    let started = Instant::now();
    // RocksDB's lock file refuses a directory a running node holds.
    let db = storage::open(data_dir, storage::DEFAULT_MAX_WAL_BYTES).map_err(|e| {
        local(format!(
            "cannot open {} (is its node still running?): {e}",
            data_dir.display()
        ))
    })?;
    // Opening the state machine finishes a snapshot install the node was
    // stopped in (`StateMachine::open`): a backup never holds half of one.
    storage::StateMachine::open(db.clone(), data_dir.join("snapshots"), 0).map_err(local)?;
    // What the node's log holds beyond its applied state (killed, say, or
    // the last survivor of its cluster) is applied first, to a copy.
    let scratch = data_dir.join("offline-save.tmp");
    storage::scratch_copy(&db, data_dir, &scratch).map_err(local)?;
    drop(db);
    let saved = save_copy(&scratch, file).await;
    if let Err(e) = std::fs::remove_dir_all(&scratch) {
        eprintln!("could not remove {}: {e}", scratch.display());
    }
    let (replayed, header, end) = saved?;
    println!(
        "saved {} offline from {} at index {} ({replayed} log entries applied first): {} records, {} changes, {} audit entries in {:.1} s",
        file.display(),
        data_dir.display(),
        header.last_applied.map(|l| l.index).unwrap_or(0),
        end.records,
        end.changes,
        end.audit,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Deletes all but the `keep` newest `agentry-*.backup` files of `dir`
/// (their names sort by time), and the `.part` files of saves that were
/// cut off.
fn prune(dir: &Path, keep: usize) -> Result<(), CliError> {
    for entry in std::fs::read_dir(dir)
        .map_err(local)?
        .filter_map(Result::ok)
    {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("agentry-") && name.ends_with(".part") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let mut backups: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(local)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("agentry-") && n.ends_with(".backup"))
        })
        .collect();
    backups.sort();
    let old = backups.len().saturating_sub(keep);
    for path in &backups[..old] {
        std::fs::remove_file(path).map_err(|e| local(format!("{}: {e}", path.display())))?;
        println!("removed {}", path.display());
    }
    Ok(())
}

fn create_private(path: &Path) -> Result<std::fs::File, CliError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|e| local(format!("cannot create {}: {e}", path.display())))
}

fn status(file: &Path, json: bool) -> Result<(), CliError> {
    let reader = std::io::BufReader::new(
        std::fs::File::open(file).map_err(|e| local(format!("{}: {e}", file.display())))?,
    );
    let (header, end) = storage::verify_backup(reader).map_err(local)?;
    let members: BTreeMap<u64, String> = header
        .membership
        .membership()
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect();
    let summary = serde_json::json!({
        "format": header.agentry_backup,
        "created": header.created,
        "node_id": header.node_id,
        "index": header.last_applied.map(|l| l.index).unwrap_or(0),
        "term": header.last_applied.map(|l| l.leader_id.term).unwrap_or(0),
        "members": members,
        "records": end.records,
        "changes": end.changes,
        "audit_entries": end.audit,
        "leases": end.leases,
        "publisher_keys": header.publisher_keys.len(),
        "identity": header.identity.is_some(),
        "sha256": end.sha256,
    });
    if json {
        println!("{summary}");
    } else {
        println!(
            "{}: checksum ok; taken {} from node {} at index {} (term {}); {} records, {} changes, {} audit entries, {} publisher keys, identity {}",
            file.display(),
            header.created,
            header.node_id,
            summary["index"],
            summary["term"],
            end.records,
            end.changes,
            end.audit,
            header.publisher_keys.len(),
            if header.identity.is_some() { "included" } else { "not established" },
        );
    }
    Ok(())
}
