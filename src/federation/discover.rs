//! Federated discovery, the asking side: the same request to every peer
//! in parallel under one deadline, and only records whose signatures check
//! out against pinned keys come back.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;
use tracing::{debug, warn};

use super::{Peer, Peers, Refusal};
use crate::domain::discovery::DiscoveryRequest;
use crate::domain::{AgentRecord, Provenance};
use crate::pb;

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
            Ok(Ok(resp)) => accept(peers, peer, resp.into_inner(), &mut asked),
        }
    }
    asked
}

/// Checks one peer's answer: each record against the keys pinned for the
/// authority that signed it.
fn accept(peers: &Peers, peer: &Peer, answer: pb::PeerDiscoverResponse, asked: &mut Asked) {
    if let Some(info) = &answer.registry {
        peer.learn(info);
    }
    for w in answer.warnings {
        asked.warnings.push(format!("peer {}: {w}", peer.authority));
    }
    let now = crate::domain::time::now();
    let mut refused: Vec<String> = Vec::new();
    for c in answer.candidates {
        let relayed = c.origin_authority != peer.authority;
        let verifier = if relayed {
            peers.get(&c.origin_authority).map(|p| p.as_ref())
        } else {
            Some(peer)
        };
        let checked = match verifier {
            None => Err(Refusal::NoPinnedKeys(c.origin_authority.clone())),
            Some(v) => serde_json::from_str::<Value>(&c.record_json)
                .map_err(|e| Refusal::Malformed(e.to_string()))
                .and_then(|served| v.verify(&served).map(|r| (r, served))),
        };
        let (record, served) = match checked {
            Ok((r, served)) if !r.envelope.deleted => (r, served),
            Ok(_) => continue,
            Err(why) => {
                debug!(peer = %peer.authority, origin = %c.origin_authority, %why, "refused a peer's candidate");
                refused.push(why.to_string());
                continue;
            }
        };
        let mut via = Vec::new();
        if relayed {
            via.push(peer.authority.clone());
            via.extend(c.via);
        }
        let Some(signature) = record.envelope.signature.clone() else {
            continue;
        };
        asked.remotes.push(Remote {
            provenance: Provenance {
                origin_service: if relayed {
                    c.origin_service
                } else {
                    peer.endpoint.clone()
                },
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
