//! Federated discovery, the asking side: the same request to every peer
//! in parallel under one deadline, and only records whose signatures check
//! out against pinned keys come back.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;
use tracing::{debug, warn};

use super::{Peer, Peers, Refusal};
use crate::domain::discovery::DiscoveryRequest;
use crate::domain::{AgentRecord, Provenance};
use crate::pb;

/// Warnings of one peer's answer passed on to the caller, and the length
/// of each: a peer's say in the answer stays a few lines.
const MAX_WARNINGS: usize = 16;
const MAX_WARNING_CHARS: usize = 500;

/// A peer's candidate that passed every check.
pub struct Remote {
    pub record: AgentRecord,
    /// The record exactly as received (what the signature covers), for
    /// relaying it unchanged.
    pub served: Value,
    pub provenance: Provenance,
}

/// What the peers answered, and what went wrong with them.
#[derive(Default)]
pub struct Asked {
    pub remotes: Vec<Remote>,
    pub warnings: Vec<String>,
}

/// A request on its way to peers.
pub struct Outbound<'a> {
    pub request: &'a DiscoveryRequest,
    /// Hops left after the peers asked now (0: they answer for themselves).
    pub hops_left: u32,
    /// Authorities already asked, this registry's own included.
    pub visited: &'a [String],
    pub own_authority: &'a str,
    pub deadline: Duration,
}

/// Asks every fan-out peer that has not been visited.
pub async fn fan_out(peers: &Peers, out: Outbound<'_>) -> Asked {
    let targets: Vec<_> = peers
        .all()
        .iter()
        .filter(|p| p.fan_out && p.authority != out.own_authority)
        .filter(|p| !out.visited.contains(&p.authority))
        .cloned()
        .collect();
    if targets.is_empty() {
        return Asked::default();
    }
    // Everyone asked now is visited for the hops after: no peer is asked
    // twice for one request, so loops cannot form.
    let mut visited: Vec<String> = out.visited.to_vec();
    if !out.own_authority.is_empty() && !visited.iter().any(|v| v == out.own_authority) {
        visited.push(out.own_authority.to_string());
    }
    visited.extend(targets.iter().map(|p| p.authority.clone()));
    let request = pb::DiscoverRequest::from(out.request);
    let asks = targets.iter().map(|peer| {
        let req = pb::PeerDiscoverRequest {
            request: Some(request.clone()),
            hops_left: out.hops_left.min(peer.hops),
            visited: visited.clone(),
            requester: out.own_authority.to_string(),
            deadline_ms: out.deadline.as_millis().min(u128::from(u32::MAX)) as u32,
        };
        let mut client = peer.client();
        async move {
            let mut call = tonic::Request::new(req);
            call.set_timeout(out.deadline);
            tokio::time::timeout(out.deadline, client.discover(call)).await
        }
    });
    let answers = join_all(asks).await;
    let mut asked = Asked::default();
    let mut answered = HashSet::new();
    for (peer, answer) in targets.iter().zip(answers) {
        match answer {
            Err(_) => {
                warn!(peer = %peer.authority, "peer did not answer in time");
                asked.warnings.push(format!(
                    "peer {} did not answer within {} ms; its agents are included only as far as this registry keeps copies of them",
                    peer.authority,
                    out.deadline.as_millis()
                ));
            }
            Ok(Err(status)) => {
                warn!(peer = %peer.authority, error = %status.message(), "peer discovery failed");
                asked.warnings.push(format!(
                    "peer {} failed ({}: {}); its agents are included only as far as this registry keeps copies of them",
                    peer.authority,
                    status.code(),
                    status.message()
                ));
            }
            Ok(Ok(resp)) => {
                answered.insert(peer.authority.clone());
                let bounds = Bounds {
                    hops: out.hops_left.min(peer.hops),
                    per_origin: out.request.effective_limit() as usize,
                    record_bytes: peers.max_record_bytes,
                };
                accept(peers, peer, bounds, resp.into_inner(), &mut asked);
            }
        }
    }
    prefer_origins(&mut asked.remotes, &answered);
    asked
}

/// An origin that answered for itself is the authority on its records: a
/// copy relayed by another peer that the origin did not return (an older
/// revision kept after the origin deleted it, say) is dropped.
fn prefer_origins(remotes: &mut Vec<Remote>, answered: &HashSet<String>) {
    let direct: HashSet<(String, String)> = remotes
        .iter()
        .filter(|r| r.provenance.via.is_empty())
        .map(|r| {
            (
                r.provenance.origin_authority.clone(),
                r.record.metadata.id.clone(),
            )
        })
        .collect();
    remotes.retain(|r| {
        let origin = &r.provenance.origin_authority;
        r.provenance.via.is_empty()
            || !answered.contains(origin)
            || direct.contains(&(origin.clone(), r.record.metadata.id.clone()))
    });
}

/// What one peer's answer may hold.
struct Bounds {
    /// Relays a relayed record may have passed.
    hops: u32,
    /// Records of one origin (each registry was asked for its best this
    /// many).
    per_origin: usize,
    /// Size of one served record.
    record_bytes: usize,
}

/// Checks one peer's answer: each record against the keys pinned for the
/// authority that signed it, within `bounds`.
fn accept(
    peers: &Peers,
    peer: &Peer,
    bounds: Bounds,
    answer: pb::PeerDiscoverResponse,
    asked: &mut Asked,
) {
    if let Some(info) = &answer.registry {
        peer.learn(info);
    }
    let passed_on = answer.warnings.len().min(MAX_WARNINGS);
    for w in answer.warnings.iter().take(MAX_WARNINGS) {
        let w: String = w.chars().take(MAX_WARNING_CHARS).collect();
        asked.warnings.push(format!("peer {}: {w}", peer.authority));
    }
    if answer.warnings.len() > passed_on {
        asked.warnings.push(format!(
            "peer {}: {} more warning(s) not passed on",
            peer.authority,
            answer.warnings.len() - passed_on
        ));
    }
    let now = crate::domain::time::now();
    let mut refused: Vec<String> = Vec::new();
    let mut per_origin: HashMap<String, usize> = HashMap::new();
    for c in answer.candidates {
        let seen = per_origin.entry(c.origin_authority.clone()).or_default();
        *seen += 1;
        let relayed = c.origin_authority != peer.authority;
        let verifier = if relayed {
            peers.get(&c.origin_authority).map(|p| p.as_ref())
        } else {
            Some(peer)
        };
        // The relays a relayed record passed, the answering peer first.
        let mut via = Vec::new();
        if relayed {
            via.push(peer.authority.clone());
            via.extend(c.via);
        }
        let checked = match verifier {
            None => Err(Refusal::NoPinnedKeys(c.origin_authority.clone())),
            Some(_) if via.len() > bounds.hops as usize => Err(Refusal::OutOfBounds(format!(
                "relayed over {} peer(s) where {} hop(s) were allowed",
                via.len(),
                bounds.hops
            ))),
            Some(_) if *seen > bounds.per_origin => Err(Refusal::OutOfBounds(format!(
                "more than the {} record(s) asked for from {}",
                bounds.per_origin, c.origin_authority
            ))),
            Some(_) if c.record_json.len() > bounds.record_bytes => {
                Err(Refusal::TooLarge(c.record_json.len(), bounds.record_bytes))
            }
            Some(v) => crate::domain::json::parse_json(c.record_json.as_bytes())
                .map_err(|e| Refusal::Malformed(e.to_string()))
                .and_then(|served| v.verify(&served).map(|r| (r, served, v))),
        };
        let (record, served, origin) = match checked {
            Ok((r, served, origin)) if !r.envelope.deleted => (r, served, origin),
            Ok(_) => continue,
            Err(why) => {
                debug!(peer = %peer.authority, origin = %c.origin_authority, %why, "refused a peer's candidate");
                refused.push(why.to_string());
                continue;
            }
        };
        let Some(signature) = record.envelope.signature.clone() else {
            continue;
        };
        asked.remotes.push(Remote {
            provenance: Provenance {
                // Where this registry reaches the origin, whatever a relay
                // says.
                origin_service: origin.endpoint.clone(),
                origin_authority: c.origin_authority,
                origin_signature: signature,
                received_at: now.clone(),
                origin_revision: record.envelope.revision,
                origin_envelope: Value::Null,
                via,
            },
            record,
            served,
        });
    }
    if let Some(first) = refused.first() {
        warn!(peer = %peer.authority, refused = refused.len(), reason = %first, "refused records from a peer");
        asked.warnings.push(format!(
            "peer {}: {} record(s) refused ({first})",
            peer.authority,
            refused.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentMetadata, RegistrySignature};

    fn remote(origin: &str, id: &str, via: &[&str]) -> Remote {
        Remote {
            record: AgentRecord {
                metadata: AgentMetadata {
                    id: id.into(),
                    ..Default::default()
                },
                envelope: Default::default(),
            },
            served: Value::Null,
            provenance: Provenance {
                origin_service: String::new(),
                origin_authority: origin.into(),
                origin_signature: RegistrySignature::default(),
                received_at: String::new(),
                origin_revision: 1,
                origin_envelope: Value::Null,
                via: via.iter().map(|v| v.to_string()).collect(),
            },
        }
    }

    #[test]
    fn an_origin_that_answered_overrules_relays_of_its_records() {
        let mut remotes = vec![
            remote("b.example", "urn:b:kept", &[]),
            remote("b.example", "urn:b:kept", &["c.example"]),
            // b answered without it (deleted there, say): c's copy goes.
            remote("b.example", "urn:b:deleted", &["c.example"]),
            // d did not answer here: what c relays of d stays.
            remote("d.example", "urn:d:1", &["c.example"]),
        ];
        let answered = HashSet::from(["b.example".to_string(), "c.example".to_string()]);
        prefer_origins(&mut remotes, &answered);
        let left: Vec<(&str, usize)> = remotes
            .iter()
            .map(|r| (r.record.metadata.id.as_str(), r.provenance.via.len()))
            .collect();
        assert_eq!(left, [("urn:b:kept", 0), ("urn:b:kept", 1), ("urn:d:1", 1)]);
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use crate::federation::tests::{identity, peer, signed};
    use crate::federation::TrustPolicy;

    #[tokio::test]
    async fn an_answer_holds_no_more_than_was_asked_of_each_origin_nor_oversized_records() {
        let b = identity("b.example");
        let p = peer("b.example", &b, TrustPolicy::default());
        let peers = Peers::default();
        let candidate = |id: &str, padding: usize| {
            let mut served = signed(&b, id, &["weather"]);
            if padding > 0 {
                // Unsigned bulk: refused for its size before its signature.
                served["padding"] = "x".repeat(padding).into();
            }
            pb::PeerCandidate {
                record_json: served.to_string(),
                origin_authority: "b.example".into(),
                ..Default::default()
            }
        };
        let answer = pb::PeerDiscoverResponse {
            candidates: vec![
                candidate("urn:b:1", 0),
                candidate("urn:b:big", 20_000),
                candidate("urn:b:2", 0),
                candidate("urn:b:3", 0),
            ],
            ..Default::default()
        };
        let bounds = || Bounds {
            hops: 0,
            per_origin: 3,
            record_bytes: 10_000,
        };
        let mut asked = Asked::default();
        accept(&peers, &p, bounds(), answer, &mut asked);
        let kept: Vec<&str> = asked
            .remotes
            .iter()
            .map(|r| r.record.metadata.id.as_str())
            .collect();
        assert_eq!(kept, ["urn:b:1", "urn:b:2"]);
        let warning = asked.warnings.join("\n");
        assert!(
            warning.contains("2 record(s) refused") && warning.contains("20"),
            "{warning}"
        );
        let noisy = pb::PeerDiscoverResponse {
            warnings: vec!["w".repeat(10_000); 100],
            ..Default::default()
        };
        let mut asked = Asked::default();
        accept(&peers, &p, bounds(), noisy, &mut asked);
        assert_eq!(asked.warnings.len(), MAX_WARNINGS + 1);
        assert!(asked.warnings.iter().all(|w| w.len() < 600));
        assert!(asked.warnings[MAX_WARNINGS].contains("84 more"));
    }
}
