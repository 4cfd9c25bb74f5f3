//! `agentry.v1.Peering`: what other registries call, on the peer listener.
//! Records travel as the JSON their signature covers, so the receiver
//! checks exactly the bytes' meaning the origin signed.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::federation::FederationApi;
use crate::crypto::signature::served_form;
use crate::domain::discovery::DiscoveryRequest;
use crate::pb::{self, peering_server::Peering};
use crate::service::{FeedEvent, ServiceError};

/// The longest deadline a peer may ask for.
const MAX_PEER_DEADLINE: Duration = Duration::from_secs(60);

#[tonic::async_trait]
impl Peering for FederationApi {
    #[tracing::instrument(name = "peer.GetRegistryInfo", skip_all)]
    async fn get_registry_info(
        &self,
        _req: Request<pb::GetRegistryInfoRequest>,
    ) -> Result<Response<pb::RegistryInfo>, Status> {
        Ok(Response::new(self.info(self.service.identity())))
    }

    #[tracing::instrument(name = "peer.Discover", skip_all, fields(requester = %req.get_ref().requester))]
    async fn discover(
        &self,
        req: Request<pb::PeerDiscoverRequest>,
    ) -> Result<Response<pb::PeerDiscoverResponse>, Status> {
        let r = req.into_inner();
        let request = r.request.ok_or_else(|| {
            Status::from(ServiceError::InvalidRequest {
                field: Some("/request".into()),
                message: "/request: is required".into(),
            })
        })?;
        let request = DiscoveryRequest::try_from(request).map_err(ServiceError::from)?;
        let deadline = match r.deadline_ms {
            0 => MAX_PEER_DEADLINE,
            ms => Duration::from_millis(ms.into()).min(MAX_PEER_DEADLINE),
        };
        let answer = self
            .service
            .answer_peer(request, r.hops_left, r.visited, deadline)
            .await?;
        let authority = self.service.own_authority();
        let mut candidates: Vec<pb::PeerCandidate> = answer
            .own
            .iter()
            .map(|record| pb::PeerCandidate {
                record_json: served_form(record).to_string(),
                origin_authority: authority.clone(),
                origin_service: self.endpoint.clone(),
                via: Vec::new(),
            })
            .collect();
        candidates.extend(answer.relayed.into_iter().map(|remote| pb::PeerCandidate {
            record_json: remote.served.to_string(),
            origin_authority: remote.provenance.origin_authority,
            origin_service: remote.provenance.origin_service,
            via: remote.provenance.via,
        }));
        Ok(Response::new(pb::PeerDiscoverResponse {
            authority,
            candidates,
            warnings: answer.warnings,
            registry: Some(self.info(self.service.identity())),
        }))
    }

    type FollowStream = Pin<Box<dyn Stream<Item = Result<pb::FollowEvent, Status>> + Send>>;

    #[tracing::instrument(name = "peer.Follow", skip_all, fields(from = req.get_ref().from_revision))]
    async fn follow(
        &self,
        req: Request<pb::FollowRequest>,
    ) -> Result<Response<Self::FollowStream>, Status> {
        let feed = self
            .service
            .public_feed(req.get_ref().from_revision)
            .await?;
        let stream = feed.map(|e| {
            e.map(|e| match e {
                FeedEvent::Record { record, listing } => pb::FollowEvent {
                    revision: record.envelope.revision,
                    record_json: served_form(&record).to_string(),
                    listing,
                    ..Default::default()
                },
                FeedEvent::Withdrawn { id, revision } => pb::FollowEvent {
                    revision,
                    withdrawn_id: id,
                    ..Default::default()
                },
                FeedEvent::ListingDone { revision } => pb::FollowEvent {
                    revision,
                    listing_done: true,
                    ..Default::default()
                },
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
