//! Installing a snapshot document: the whole state a leader sends a
//! follower that its log can no longer bring up (written by
//! `StateMachine::write_snapshot_data`).
//!
//! The document holds every record, change and audit entry. Decoded whole,
//! it took several times its size in memory: a node joining a directory of
//! 100k agents peaked at 1.7 GiB, and at a million agents it would need far
//! more than the node itself. It is read as a stream instead: each element
//! goes into the database as soon as it is parsed, in batches of bounded
//! size, so an install holds one element and one batch, whatever the
//! directory's size.
//!
//! Streamed, the install is no longer one atomic batch, so it is made
//! restartable instead. The first batch clears the state and the applied
//! log id; the elements are written without the WAL, their column families
//! are flushed, and only then does a last batch write the applied log id.
//! The caller keeps the document as the current snapshot before it starts,
//! so a node stopped part-way finds that snapshot ahead of its applied
//! state and installs it again when it opens (`StateMachine::open`).
//! Readers are told to wait meanwhile (`Reader`, `StorageError::Installing`).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read, Write};

use rocksdb::{WriteBatch, DB};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess};
use serde::{Deserialize, Deserializer, Serialize};

use super::state_machine::{
    KEY_APPLIED, KEY_AUDIT_SEQ, KEY_CLUSTER, KEY_FEDERATION_CURSORS, KEY_IDENTITY, KEY_MEMBERSHIP,
    KEY_OLDEST, KEY_PUBLISHER_KEYS, KEY_REVISION,
};
use super::{
    cf, u64_key, unlogged, StorageError, CF_AGENTS, CF_AUDIT, CF_CHANGES, CF_LEASES, CF_SM,
};
use crate::consensus::{ClusterRecord, LogId, NodeId};
use crate::crypto::Identity;
use crate::domain::audit::AuditEntry;
use crate::domain::lease::{LeaseEntry, LeaseTable};
use crate::domain::{AgentRecord, Change, PublisherKey};

/// Bytes of elements written per batch.
const BATCH_BYTES: usize = 4 << 20;

/// The column families a document replaces wholly.
const REPLACED: [&str; 4] = [CF_AGENTS, CF_CHANGES, CF_AUDIT, CF_LEASES];

/// What the installed state holds beside the database, for the state
/// machine's in-memory copies.
pub(super) struct Installed {
    pub identity: Option<Identity>,
    pub publisher_keys: Vec<PublisherKey>,
    pub cluster: ClusterRecord,
    pub audit_seq: u64,
    pub leases: LeaseTable,
    pub revision: u64,
    pub oldest_revision: u64,
}

/// Replaces the state in `db` with the document read from `document`, the
/// snapshot `meta` describes.
pub(super) fn install(
    db: &DB,
    meta: &openraft::SnapshotMeta<NodeId, openraft::BasicNode>,
    document: impl Read,
) -> Result<Installed, StorageError> {
    let sm = cf(db, CF_SM)?;
    let mut clear = WriteBatch::default();
    // Range deletions cover every possible key (agent ids and lease keys
    // are bounded in length, far below this upper key).
    for name in REPLACED {
        clear.delete_range_cf(cf(db, name)?, [0u8].as_slice(), [0xffu8; 1024].as_slice());
    }
    clear.delete_cf(sm, KEY_APPLIED);
    db.write(clear)?;

    let mut writer = Writer {
        db,
        batch: WriteBatch::default(),
        failed: None,
        changes: 0,
        leases: LeaseTable::default(),
    };
    let mut input =
        serde_json::Deserializer::from_reader(BufReader::with_capacity(1 << 16, document));
    let parsed = (&mut input)
        .deserialize_map(Document {
            writer: &mut writer,
        })
        .and_then(|scalars| input.end().map(|()| scalars));
    let scalars = match parsed {
        Ok(scalars) => scalars,
        Err(e) => return Err(writer.failed.take().unwrap_or(e.into())),
    };
    writer.write_batch()?;
    // The elements went in without the WAL: on disk, in one atomic flush,
    // before the applied log id says they are there.
    let replaced = REPLACED
        .iter()
        .map(|name| cf(db, name))
        .collect::<Result<Vec<_>, _>>()?;
    db.flush_cfs_opt(&replaced, &rocksdb::FlushOptions::default())?;

    let last: Option<LogId> = meta.last_log_id;
    let revision = scalars
        .revision
        .unwrap_or_else(|| last.map_or(0, |l| l.index));
    let oldest_revision = if writer.changes == 0 {
        revision + 1
    } else {
        scalars.oldest_revision.unwrap_or(1)
    };
    let mut done = WriteBatch::default();
    done.put_cf(sm, KEY_AUDIT_SEQ, serde_json::to_vec(&scalars.audit_seq)?);
    done.put_cf(sm, KEY_APPLIED, serde_json::to_vec(&last)?);
    done.put_cf(sm, KEY_REVISION, serde_json::to_vec(&revision)?);
    done.put_cf(
        sm,
        KEY_MEMBERSHIP,
        serde_json::to_vec(&meta.last_membership)?,
    );
    done.put_cf(sm, KEY_OLDEST, serde_json::to_vec(&oldest_revision)?);
    done.put_cf(
        sm,
        KEY_PUBLISHER_KEYS,
        serde_json::to_vec(&scalars.publisher_keys)?,
    );
    done.put_cf(
        sm,
        KEY_FEDERATION_CURSORS,
        serde_json::to_vec(&scalars.federation_cursors)?,
    );
    done.put_cf(sm, KEY_CLUSTER, serde_json::to_vec(&scalars.cluster)?);
    match &scalars.identity {
        Some(identity) => done.put_cf(sm, KEY_IDENTITY, serde_json::to_vec(identity)?),
        None => done.delete_cf(sm, KEY_IDENTITY),
    }
    db.write(done)?;
    Ok(Installed {
        identity: scalars.identity,
        publisher_keys: scalars.publisher_keys,
        cluster: scalars.cluster,
        audit_seq: scalars.audit_seq,
        leases: writer.leases,
        revision,
        oldest_revision,
    })
}

/// Copies a received document to `to`, checking on the way that it is one
/// whole JSON value: a document cut short or garbled is refused before it
/// replaces the current snapshot or anything of the state.
pub(super) fn copy_checked(from: impl Read, to: impl Write) -> Result<(), StorageError> {
    struct Tee<R, W>(R, W);
    impl<R: Read, W: Write> Read for Tee<R, W> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.write_all(&buf[..n])?;
            Ok(n)
        }
    }
    let mut input =
        serde_json::Deserializer::from_reader(BufReader::with_capacity(1 << 16, Tee(from, to)));
    IgnoredAny::deserialize(&mut input)?;
    // Reads to the end: only whitespace may follow.
    input.end()?;
    Ok(())
}

/// The document's members other than its element lists. Members a
/// document from an earlier version lacks keep their defaults.
#[derive(Default)]
struct Scalars {
    oldest_revision: Option<u64>,
    revision: Option<u64>,
    identity: Option<Identity>,
    publisher_keys: Vec<PublisherKey>,
    federation_cursors: BTreeMap<String, u64>,
    audit_seq: u64,
    cluster: ClusterRecord,
}

/// Writes elements into the database in bounded batches.
struct Writer<'a> {
    db: &'a DB,
    batch: WriteBatch,
    /// The storage error that stopped the parse (the parser carries only
    /// its message).
    failed: Option<StorageError>,
    changes: u64,
    leases: LeaseTable,
}

impl Writer<'_> {
    fn put(
        &mut self,
        name: &'static str,
        key: &[u8],
        value: &impl Serialize,
    ) -> Result<(), String> {
        let written = (|| {
            self.batch
                .put_cf(cf(self.db, name)?, key, serde_json::to_vec(value)?);
            if self.batch.size_in_bytes() >= BATCH_BYTES {
                self.write_batch()?;
            }
            Ok(())
        })();
        written.map_err(|e: StorageError| {
            let message = e.to_string();
            self.failed = Some(e);
            message
        })
    }

    fn write_batch(&mut self) -> Result<(), StorageError> {
        self.db
            .write_opt(std::mem::take(&mut self.batch), &unlogged())?;
        Ok(())
    }
}

/// The document's top level: a map whose element lists are written as
/// they are read, in whatever order the members come.
struct Document<'w, 'a> {
    writer: &'w mut Writer<'a>,
}

impl<'de> de::Visitor<'de> for Document<'_, '_> {
    type Value = Scalars;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a snapshot document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalars, A::Error> {
        let writer = self.writer;
        let mut s = Scalars::default();
        while let Some(key) = map.next_key::<String>()? {
            let list = match key.as_str() {
                "records" => Some(List::Records),
                "changes" => Some(List::Changes),
                "audit" => Some(List::Audit),
                "leases" => Some(List::Leases),
                _ => None,
            };
            if let Some(list) = list {
                map.next_value_seed(Elements {
                    writer: &mut *writer,
                    list,
                })?;
                continue;
            }
            match key.as_str() {
                "oldest_revision" => s.oldest_revision = Some(map.next_value()?),
                "revision" => s.revision = map.next_value()?,
                "identity" => s.identity = map.next_value()?,
                "publisher_keys" => s.publisher_keys = map.next_value()?,
                "federation_cursors" => s.federation_cursors = map.next_value()?,
                "audit_seq" => s.audit_seq = map.next_value()?,
                "cluster" => s.cluster = map.next_value()?,
                // The log id and membership come with the snapshot's
                // metadata; anything else is from a later version.
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(s)
    }
}

#[derive(Clone, Copy)]
enum List {
    Records,
    Changes,
    Audit,
    Leases,
}

/// One element list, written element by element.
struct Elements<'w, 'a> {
    writer: &'w mut Writer<'a>,
    list: List,
}

impl<'de> DeserializeSeed<'de> for Elements<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> de::Visitor<'de> for Elements<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of stored values")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let w = self.writer;
        match self.list {
            List::Records => each(&mut seq, |r: AgentRecord| {
                w.put(CF_AGENTS, r.metadata.id.as_bytes(), &r)
            }),
            List::Changes => each(&mut seq, |c: Change| {
                w.changes += 1;
                w.put(CF_CHANGES, &u64_key(c.revision), &c)
            }),
            List::Audit => each(&mut seq, |e: AuditEntry| {
                w.put(CF_AUDIT, &u64_key(e.seq), &e)
            }),
            List::Leases => each(&mut seq, |e: LeaseEntry| {
                w.put(CF_LEASES, &e.key(), &e)?;
                w.leases.load(e);
                Ok(())
            }),
        }
    }
}

/// Hands each element of `seq` to `put`, one at a time.
fn each<'de, A: SeqAccess<'de>, T: DeserializeOwned>(
    seq: &mut A,
    mut put: impl FnMut(T) -> Result<(), String>,
) -> Result<(), A::Error> {
    while let Some(element) = seq.next_element::<T>()? {
        put(element).map_err(de::Error::custom)?;
    }
    Ok(())
}
