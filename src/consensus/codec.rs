//! The binary encoding of Raft log entries and AppendEntries
//! (`agentry.v1.RaftLogEntry`, `AppendEntriesBody`).
//!
//! A command travels as the bytes its proposer encoded ([`Proposal`]): the
//! log stores them and every follower's AppendEntries carries them (a
//! reference-counted buffer, not a copy per follower), and each node decodes
//! them once, to apply. Only the small frame around them — log id, vote — is
//! encoded per message.
//!
//! Entries written before this encoding are the JSON of openraft's `Entry`;
//! [`decode_entry`] reads both, told apart by the first byte (a JSON entry
//! is an object, `{`; a protobuf entry starts with field 1's tag, 0x0a).

use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, Entry, EntryPayload, Membership, Vote};
use prost::bytes::Bytes;
use prost::Message;

use super::{LogId, NodeId, Proposal, TypeConfig};
use crate::crypto::signature_book::Offer;
use crate::pb::{self, raft_log_entry::Payload};

/// How a node writes its log and sends AppendEntries (`raft_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Protobuf frames around the proposer's bytes.
    #[default]
    Binary,
    /// The JSON of openraft's types, as versions before the binary encoding
    /// wrote and sent (and still read); the node also tells leaders it only
    /// takes JSON. For testing mixed versions and logs of both encodings.
    Json,
}

impl Encoding {
    /// The `RaftMessage.encoding` a node in this mode advertises.
    pub fn accepts(self) -> u32 {
        match self {
            Encoding::Binary => BINARY,
            Encoding::Json => JSON,
        }
    }

    /// Whether a node in this mode says it applies batch entries
    /// (`Command::Batch`): a node imitating an older version does not.
    pub fn applies_batches(self) -> bool {
        self == Encoding::Binary
    }

    /// The apply rules a node in this mode says it follows: a node
    /// imitating an older version follows the oldest.
    pub fn apply_rules(self) -> u32 {
        match self {
            Encoding::Binary => super::command::APPLY_RULES,
            Encoding::Json => 0,
        }
    }
}

/// `RaftMessage.encoding` values.
pub const JSON: u32 = 0;
pub const BINARY: u32 = 1;

/// Why bytes did not decode as a log entry or AppendEntries.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("bad protobuf: {0}")]
    Proto(#[from] prost::DecodeError),
    #[error("bad JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0} is missing")]
    Missing(&'static str),
}

fn log_id_pb(id: &LogId) -> pb::RaftLogId {
    pb::RaftLogId {
        term: id.leader_id.term,
        node_id: id.leader_id.node_id,
        index: id.index,
    }
}

fn log_id(id: pb::RaftLogId) -> LogId {
    LogId::new(CommittedLeaderId::new(id.term, id.node_id), id.index)
}

fn entry_pb(entry: &Entry<TypeConfig>) -> Result<pb::RaftLogEntry, CodecError> {
    let payload = match &entry.payload {
        EntryPayload::Blank => Payload::Blank(pb::RaftBlank {}),
        EntryPayload::Normal(p) => Payload::Command(p.bytes().clone()),
        EntryPayload::Membership(m) => Payload::Membership(serde_json::to_vec(m)?.into()),
    };
    Ok(pb::RaftLogEntry {
        log_id: Some(log_id_pb(&entry.log_id)),
        payload: Some(payload),
    })
}

fn entry(e: pb::RaftLogEntry) -> Result<Entry<TypeConfig>, CodecError> {
    let payload = match e.payload.ok_or(CodecError::Missing("entry payload"))? {
        Payload::Blank(_) => EntryPayload::Blank,
        Payload::Command(bytes) => EntryPayload::Normal(Proposal::from_bytes(bytes)),
        Payload::Membership(json) => {
            EntryPayload::Membership(serde_json::from_slice::<Membership<NodeId, _>>(&json)?)
        }
    };
    Ok(Entry {
        log_id: log_id(e.log_id.ok_or(CodecError::Missing("entry log id"))?),
        payload,
    })
}

/// A log entry as the log stores it.
pub fn encode_entry(entry: &Entry<TypeConfig>, encoding: Encoding) -> Result<Vec<u8>, CodecError> {
    match encoding {
        Encoding::Binary => Ok(entry_pb(entry)?.encode_to_vec()),
        Encoding::Json => Ok(serde_json::to_vec(entry)?),
    }
}

/// A stored log entry, in either encoding.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, CodecError> {
    if bytes.first() == Some(&b'{') {
        return Ok(serde_json::from_slice(bytes)?);
    }
    entry(pb::RaftLogEntry::decode(bytes)?)
}

/// AppendEntries in the binary encoding, with the leader's signature
/// `offers` and the log index it has applied (`signature_book`).
pub fn encode_append(
    rpc: &AppendEntriesRequest<TypeConfig>,
    offers: &[Offer],
    leader_applied: u64,
) -> Result<Vec<u8>, CodecError> {
    let body = pb::AppendEntriesBody {
        vote: Some(pb::RaftVote {
            term: rpc.vote.leader_id.term,
            node_id: rpc.vote.leader_id.node_id,
            committed: rpc.vote.committed,
        }),
        prev_log_id: rpc.prev_log_id.as_ref().map(log_id_pb),
        entries: rpc.entries.iter().map(entry_pb).collect::<Result<_, _>>()?,
        leader_commit: rpc.leader_commit.as_ref().map(log_id_pb),
        signatures: offers
            .iter()
            .map(|o| pb::SignatureOffer {
                revision: o.revision,
                digest: o.digest.to_vec(),
                value: o.value.clone(),
            })
            .collect(),
        leader_applied,
    };
    Ok(body.encode_to_vec())
}

/// An AppendEntries as received: the request, and the leader's signature
/// offers and applied index (none and 0 from older leaders).
pub struct ReceivedAppend {
    pub rpc: AppendEntriesRequest<TypeConfig>,
    pub offers: Vec<Offer>,
    pub leader_applied: u64,
}

/// AppendEntries from its binary encoding. Takes `Bytes` so the commands
/// stay slices of the received message instead of copies.
pub fn decode_append(bytes: Bytes) -> Result<ReceivedAppend, CodecError> {
    let body = pb::AppendEntriesBody::decode(bytes)?;
    // A digest of another length is no digest of ours: that offer is
    // dropped (the follower signs for itself).
    let offers = body
        .signatures
        .into_iter()
        .filter_map(|o| {
            Some(Offer {
                revision: o.revision,
                digest: o.digest.as_slice().try_into().ok()?,
                value: o.value,
            })
        })
        .collect();
    let v = body.vote.ok_or(CodecError::Missing("vote"))?;
    let vote = if v.committed {
        Vote::new_committed(v.term, v.node_id)
    } else {
        Vote::new(v.term, v.node_id)
    };
    let rpc = AppendEntriesRequest {
        vote,
        prev_log_id: body.prev_log_id.map(log_id),
        entries: body
            .entries
            .into_iter()
            .map(entry)
            .collect::<Result<_, _>>()?,
        leader_commit: body.leader_commit.map(log_id),
    };
    Ok(ReceivedAppend {
        rpc,
        offers,
        leader_applied: body.leader_applied,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::consensus::Command;

    fn entries() -> Vec<Entry<TypeConfig>> {
        let id = |term, node, index| LogId::new(CommittedLeaderId::new(term, node), index);
        let command = Command::Note {
            now: "2026-11-26T00:00:00Z".into(),
        };
        vec![
            Entry {
                log_id: id(1, 1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: id(1, 1, 2),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1, 2, 3])],
                    None,
                )),
            },
            Entry {
                log_id: id(2, 3, 3),
                payload: EntryPayload::Normal(Proposal::new(&command).unwrap()),
            },
        ]
    }

    #[test]
    fn entries_of_both_encodings_decode_to_the_same_entry() {
        for e in entries() {
            let binary = encode_entry(&e, Encoding::Binary).unwrap();
            let json = encode_entry(&e, Encoding::Json).unwrap();
            assert_ne!(binary[0], b'{');
            // JSON as versions before the binary encoding wrote it.
            assert_eq!(json, serde_json::to_vec(&e).unwrap());
            for bytes in [&binary, &json] {
                let back = decode_entry(bytes).unwrap();
                assert_eq!(back.log_id, e.log_id);
                assert_eq!(
                    serde_json::to_value(&back.payload).unwrap(),
                    serde_json::to_value(&e.payload).unwrap()
                );
            }
        }
    }

    #[test]
    fn a_command_is_carried_as_the_proposers_bytes() {
        let e = entries().pop().unwrap();
        let EntryPayload::Normal(sent) = &e.payload else {
            panic!("a command")
        };
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(2, 3),
            prev_log_id: Some(entries()[1].log_id),
            entries: vec![e.clone()],
            leader_commit: None,
        };
        let offer = Offer {
            revision: 9,
            digest: [7; 32],
            value: "c2lnbmF0dXJl".into(),
        };
        let received = decode_append(
            encode_append(&rpc, std::slice::from_ref(&offer), 8)
                .unwrap()
                .into(),
        )
        .unwrap();
        assert_eq!(received.offers, vec![offer]);
        assert_eq!(received.leader_applied, 8);
        let back = received.rpc;
        assert_eq!(back.vote, rpc.vote);
        assert_eq!(back.prev_log_id, rpc.prev_log_id);
        assert_eq!(back.leader_commit, None);
        let EntryPayload::Normal(got) = &back.entries[0].payload else {
            panic!("a command")
        };
        assert_eq!(got.bytes(), sent.bytes());
        assert!(matches!(got.command().unwrap(), Command::Note { .. }));
    }

    #[test]
    fn damaged_bytes_are_an_error_not_a_panic() {
        let good = encode_entry(&entries()[2], Encoding::Binary).unwrap();
        for bad in [&good[..good.len() / 2], b"{\"log_id\":", b"\x0a\xff"] {
            assert!(decode_entry(bad).is_err());
        }
        assert!(decode_append(Bytes::from_static(b"\x0a\x02\x08")).is_err());
    }
}
