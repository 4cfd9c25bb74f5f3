//! `agentry.v1.Federation` handlers: the registry's identity and key
//! management. The HTTP facade (`/.well-known/agentry.json`, `/admin/keys`)
//! calls these same handlers.

use tonic::{Request, Response, Status};

use super::grpc::principal;
use crate::crypto::{AuthorityKey, Identity, KeyState};
use crate::domain::discovery::CONFORMANCE_LEVEL;
use crate::pb::{self, federation_server::Federation};
use crate::service::{KeyChange, RegistryService};

/// The `agentry.v1.Federation` service.
#[derive(Clone)]
pub struct FederationApi {
    pub(super) service: RegistryService,
    /// Where peers reach this registry's peer listener.
    pub(super) endpoint: String,
}

impl FederationApi {
    pub fn new(service: RegistryService, endpoint: String) -> Self {
        Self { service, endpoint }
    }

    pub(super) fn info(&self, identity: Option<Identity>) -> pb::RegistryInfo {
        let established = identity.is_some();
        let identity = identity.unwrap_or_else(|| Identity {
            authority: String::new(),
            keys: Vec::new(),
            signing_key: String::new(),
        });
        pb::RegistryInfo {
            authority: identity.authority,
            keys: identity.keys.iter().map(key_to_pb).collect(),
            signing_key: identity.signing_key,
            federation_endpoint: self.endpoint.clone(),
            adp_level: CONFORMANCE_LEVEL.into(),
            established,
        }
    }

    /// Retire (`revoke` false) or revoke a key.
    async fn end_key(
        &self,
        req: Request<pb::EndKeyRequest>,
        revoke: bool,
    ) -> Result<Response<pb::KeyChangeResponse>, Status> {
        let who = principal(&req);
        let change = self
            .service
            .end_key(who.as_ref(), &req.get_ref().key_id, revoke)
            .await?;
        Ok(self.changed(change))
    }

    fn changed(&self, c: KeyChange) -> Response<pb::KeyChangeResponse> {
        Response::new(pb::KeyChangeResponse {
            info: Some(self.info(Some(c.identity))),
            resigned: c.resigned,
        })
    }
}

fn state_name(s: KeyState) -> &'static str {
    match s {
        KeyState::Valid => "valid",
        KeyState::Retired => "retired",
        KeyState::Revoked => "revoked",
    }
}

fn key_to_pb(k: &AuthorityKey) -> pb::AuthorityKey {
    pb::AuthorityKey {
        key_id: k.key_id.clone(),
        alg: crate::crypto::signature::ALG.into(),
        public_key: k.public_key.clone(),
        state: state_name(k.state).into(),
        not_before: k.not_before.clone(),
        not_after: k.not_after.clone(),
        ended_at: k.ended_at.clone(),
    }
}

/// The JSON form of `RegistryInfo` (`/.well-known/agentry.json`).
pub fn registry_info_to_json(info: &pb::RegistryInfo) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = info
        .keys
        .iter()
        .map(|k| {
            let mut v = serde_json::json!({
                "key_id": k.key_id,
                "alg": k.alg,
                "public_key": k.public_key,
                "state": k.state,
                "not_before": k.not_before,
            });
            if let Some(end) = &k.not_after {
                v["not_after"] = end.clone().into();
            }
            if let Some(end) = &k.ended_at {
                v["ended_at"] = end.clone().into();
            }
            v
        })
        .collect();
    serde_json::json!({
        "authority": info.authority,
        "keys": keys,
        "signing_key": info.signing_key,
        "federation_endpoint": info.federation_endpoint,
        "adp_level": info.adp_level,
        "established": info.established,
    })
}

fn publisher_key_to_pb(k: crate::domain::PublisherKey) -> pb::PublisherKey {
    pb::PublisherKey {
        key_id: k.key_id,
        public_key: k.public_key,
        principal: k.principal,
        namespaces: k.namespaces,
        added_at: k.added_at,
    }
}

/// The JSON form of a publisher key.
pub fn publisher_key_to_json(k: &pb::PublisherKey) -> serde_json::Value {
    serde_json::json!({
        "key_id": k.key_id,
        "public_key": k.public_key,
        "principal": k.principal,
        "namespaces": k.namespaces,
        "added_at": k.added_at,
    })
}

#[tonic::async_trait]
impl Federation for FederationApi {
    #[tracing::instrument(skip_all)]
    async fn add_publisher_key(
        &self,
        req: Request<pb::AddPublisherKeyRequest>,
    ) -> Result<Response<pb::PublisherKey>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let key = self
            .service
            .add_publisher_key(who.as_ref(), &r.public_key, r.namespaces, r.principal)
            .await?;
        Ok(Response::new(publisher_key_to_pb(key)))
    }

    #[tracing::instrument(skip_all)]
    async fn remove_publisher_key(
        &self,
        req: Request<pb::RemovePublisherKeyRequest>,
    ) -> Result<Response<pb::RemovePublisherKeyResponse>, Status> {
        let who = principal(&req);
        let downgraded = self
            .service
            .remove_publisher_key(who.as_ref(), &req.get_ref().key_id)
            .await?;
        Ok(Response::new(pb::RemovePublisherKeyResponse {
            downgraded: downgraded as u64,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn list_publisher_keys(
        &self,
        req: Request<pb::ListPublisherKeysRequest>,
    ) -> Result<Response<pb::ListPublisherKeysResponse>, Status> {
        let who = principal(&req);
        let keys = self.service.publisher_keys(who.as_ref())?;
        Ok(Response::new(pb::ListPublisherKeysResponse {
            keys: keys.into_iter().map(publisher_key_to_pb).collect(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn get_registry_info(
        &self,
        _req: Request<pb::GetRegistryInfoRequest>,
    ) -> Result<Response<pb::RegistryInfo>, Status> {
        Ok(Response::new(self.info(self.service.identity())))
    }

    #[tracing::instrument(skip_all)]
    async fn rotate_key(
        &self,
        req: Request<pb::RotateKeyRequest>,
    ) -> Result<Response<pb::KeyChangeResponse>, Status> {
        let who = principal(&req);
        let change = self
            .service
            .rotate_key(who.as_ref(), req.into_inner().not_after)
            .await?;
        Ok(self.changed(change))
    }

    #[tracing::instrument(skip_all)]
    async fn retire_key(
        &self,
        req: Request<pb::EndKeyRequest>,
    ) -> Result<Response<pb::KeyChangeResponse>, Status> {
        self.end_key(req, false).await
    }

    #[tracing::instrument(skip_all)]
    async fn revoke_key(
        &self,
        req: Request<pb::EndKeyRequest>,
    ) -> Result<Response<pb::KeyChangeResponse>, Status> {
        self.end_key(req, true).await
    }
}
