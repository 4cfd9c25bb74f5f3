//! Publisher keys and the verdict on publisher signatures (ADP
//! `signature`): a publisher registers public keys bound to its principal
//! and to the id prefixes they vouch for; metadata signed by such a key is
//! verified, anything else self-asserted.

use tracing::{info, instrument, warn};

use super::{RegistryService, ServiceError};
use crate::consensus::{Command, CommandResult, PublisherKeyChange};
use crate::crypto::keys::{decode_public, key_id};
use crate::crypto::publisher::verify_publisher;
use crate::domain::{AgentMetadata, FieldError, Principal, PublisherKey, PublisherVerification};

type Result<T> = std::result::Result<T, ServiceError>;

const MAX_NAMESPACES: usize = 32;
const MAX_NAMESPACE_LEN: usize = 256;

impl RegistryService {
    /// The verdict on `metadata`'s publisher signature for a record that
    /// `principal` writes (owned by the stored record's owner, else by the
    /// writer). A signature that is present but does not verify fails the
    /// write.
    pub(crate) fn judge_publisher(
        &self,
        metadata: &AgentMetadata,
        principal: &Principal,
    ) -> Result<PublisherVerification> {
        let owner = self
            .reader()
            .get(&metadata.id)?
            .filter(|r| !r.envelope.deleted)
            .map(|r| (r.envelope.owner, r.envelope.owner_tenant))
            .unwrap_or_else(|| (principal.name.clone(), principal.tenant.clone()));
        Ok(verify_publisher(
            metadata,
            &owner.0,
            owner.1.as_deref(),
            &self.reader().publisher_keys(),
        )?)
    }

    /// Every registered publisher key; a publisher sees its own, an admin
    /// all of them.
    pub fn publisher_keys(&self, principal: Option<&Principal>) -> Result<Vec<PublisherKey>> {
        let p = principal.ok_or_else(|| {
            ServiceError::Unauthorized("listing publisher keys needs an API key".into())
        })?;
        Ok(self
            .reader()
            .publisher_keys()
            .iter()
            .filter(|k| p.may_manage(&k.principal, k.tenant.as_deref()))
            .cloned()
            .collect())
    }

    async fn propose_key(
        &self,
        change: PublisherKeyChange,
        principal: &Principal,
    ) -> Result<(Vec<PublisherKey>, Vec<String>)> {
        let command = Command::PublisherKey {
            change,
            principal: principal.clone(),
            now: crate::domain::time::now(),
        };
        match super::audit::propose(self.node(), command).await? {
            CommandResult::PublisherKeys { keys, affected } => Ok((keys, affected)),
            CommandResult::Rejected(r) => Err(r.into()),
            other => Err(ServiceError::Internal(format!(
                "a publisher key command produced {other:?}"
            ))),
        }
    }

    /// Registers (or re-scopes) a publisher key. `owner` defaults to the
    /// caller; only admins register keys for others.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn add_publisher_key(
        &self,
        principal: Option<&Principal>,
        public_key: &str,
        namespaces: Vec<String>,
        owner: Option<String>,
    ) -> Result<PublisherKey> {
        super::audit::begin("add_publisher_key", None);
        let principal = super::registry::require_writer(principal)?;
        let public =
            decode_public(public_key).map_err(|e| FieldError::new("/public_key", e.to_string()))?;
        if namespaces.is_empty() || namespaces.len() > MAX_NAMESPACES {
            return Err(FieldError::new(
                "/namespaces",
                format!("give 1 to {MAX_NAMESPACES} agent id prefixes the key vouches for"),
            )
            .into());
        }
        for (i, n) in namespaces.iter().enumerate() {
            if n.is_empty() || n.len() > MAX_NAMESPACE_LEN || n.chars().any(char::is_control) {
                return Err(FieldError::new(
                    format!("/namespaces/{i}"),
                    format!(
                        "must be 1 to {MAX_NAMESPACE_LEN} characters without control characters"
                    ),
                )
                .into());
            }
        }
        for n in &namespaces {
            self.tenancy().check_namespace(principal, n).map_err(|_| {
                ServiceError::Denied {
                    field: Some("/namespaces".into()),
                    message: format!(
                        "/namespaces: '{n}' is outside the namespaces granted to the caller's tenant"
                    ),
                }
            })?;
        }
        // A key registered for someone else (admins only, checked in apply)
        // names that principal of no tenant unless it is the caller.
        let owner_tenant = match &owner {
            Some(o) if *o != principal.name => None,
            _ => principal.tenant.clone(),
        };
        let owner = owner.unwrap_or_else(|| principal.name.clone());
        let id = key_id(&public);
        super::audit::begin("add_publisher_key", Some(&id));
        let (keys, _) = self
            .propose_key(
                PublisherKeyChange::Add {
                    key_id: id.clone(),
                    public_key: public_key.trim().trim_end_matches('=').to_string(),
                    namespaces,
                    owner,
                    owner_tenant,
                },
                principal,
            )
            .await?;
        info!(key_id = %id, "publisher key registered");
        keys.into_iter()
            .find(|k| k.key_id == id)
            .ok_or_else(|| ServiceError::Internal("the registered key is missing".into()))
    }

    /// Removes a publisher key; records it verified are re-judged (they
    /// become self-asserted), each as a change of its own.
    #[instrument(skip_all, fields(key_id, principal = principal.map(|p| p.name.as_str())))]
    pub async fn remove_publisher_key(
        &self,
        principal: Option<&Principal>,
        key_id: &str,
    ) -> Result<usize> {
        super::audit::begin("remove_publisher_key", Some(key_id));
        let principal = super::registry::require_writer(principal)?;
        let (_, affected) = self
            .propose_key(
                PublisherKeyChange::Remove {
                    key_id: key_id.to_string(),
                },
                principal,
            )
            .await?;
        let count = affected.len();
        for id in affected {
            let command = Command::Reverify {
                id: id.clone(),
                now: crate::domain::time::now(),
            };
            match self.node().write(command).await {
                Ok(CommandResult::Applied(_) | CommandResult::Rejected(_)) => {}
                Ok(other) => warn!(agent_id = %id, result = ?other, "unexpected re-judging result"),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(count)
    }
}
