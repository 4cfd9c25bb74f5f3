//! The registry's signing identity: publishing it, changing its keys, and
//! establishing it when a cluster first starts.
//!
//! Keys are made here, outside apply (a random seed, or the operator's key
//! file), and proposed as `Command::Identity`; storage applies the change
//! and signs with it. Any node may propose: a generated identity only ever
//! founds one, so nodes racing at the first start agree on whichever came
//! first, and an operator's key file is imported once.

use std::time::Duration;

use tracing::{info, instrument, warn};

use super::{RegistryService, ServiceError};
use crate::consensus::{Command, CommandResult};
use crate::crypto::{Identity, IdentityChange, KeyFile, NewKey};
use crate::domain::{FieldError, Principal};

type Result<T> = std::result::Result<T, ServiceError>;

/// Where the identity comes from (the `[identity]` configuration).
#[derive(Debug, Clone, Default)]
pub struct IdentitySettings {
    /// The operator's DNS name, as configured.
    pub authority: Option<String>,
    /// Used when neither the configuration nor the key file names one
    /// (this host's name).
    pub fallback_authority: String,
    /// The operator's keys (for example a mounted Kubernetes secret), read
    /// before the node started.
    pub key_file: Option<KeyFile>,
}

/// The outcome of a key change.
#[derive(Debug, Clone)]
pub struct KeyChange {
    pub identity: Identity,
    pub resigned: u64,
}

fn require_admin(principal: Option<&Principal>) -> Result<()> {
    match principal {
        None => Err(ServiceError::Unauthorized(
            "key management needs an admin key (Authorization: Bearer <key>)".into(),
        )),
        Some(p) if p.role != crate::domain::Role::Admin => Err(ServiceError::Forbidden(format!(
            "principal '{}' is not an admin; only admins manage the registry's keys",
            p.name
        ))),
        Some(_) => Ok(()),
    }
}

impl RegistryService {
    /// The published identity (no secrets), once established.
    pub fn identity(&self) -> Option<Identity> {
        self.reader().identity()
    }

    async fn propose_identity(&self, change: IdentityChange) -> Result<u64> {
        let command = Command::Identity {
            change,
            now: crate::domain::time::now(),
        };
        match super::audit::propose(self.node(), command).await? {
            CommandResult::IdentityChanged { resigned, .. } => Ok(resigned),
            CommandResult::IdentityRefused(refusal) => Err(ServiceError::InvalidRequest {
                field: None,
                message: refusal.to_string(),
            }),
            other => Err(ServiceError::Internal(format!(
                "an identity command produced {other:?}"
            ))),
        }
    }

    fn identity_after_change(&self, resigned: u64) -> Result<KeyChange> {
        let identity = self.identity().ok_or_else(|| {
            ServiceError::Internal("the identity vanished after a key change".into())
        })?;
        Ok(KeyChange { identity, resigned })
    }

    /// Adds a freshly generated key and signs with it from now on.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub async fn rotate_key(
        &self,
        principal: Option<&Principal>,
        not_after: Option<String>,
    ) -> Result<KeyChange> {
        super::audit::begin("rotate_key", None);
        require_admin(principal)?;
        if let Some(end) = &not_after {
            if crate::domain::time::parse(end).is_none() {
                return Err(FieldError::new(
                    "/not_after",
                    format!("'{end}' is not an RFC 3339 time"),
                )
                .into());
            }
        }
        if self.identity().is_none() {
            return Err(ServiceError::no_signing_identity());
        }
        let mut key = NewKey::generate().map_err(|e| ServiceError::Internal(e.to_string()))?;
        key.not_after = not_after;
        let resigned = self
            .propose_identity(IdentityChange::Rotate { key })
            .await?;
        info!("signing key rotated");
        self.identity_after_change(resigned)
    }

    /// Retires (`revoke` false) or revokes a key that no longer signs.
    #[instrument(skip_all, fields(key_id, revoke, principal = principal.map(|p| p.name.as_str())))]
    pub async fn end_key(
        &self,
        principal: Option<&Principal>,
        key_id: &str,
        revoke: bool,
    ) -> Result<KeyChange> {
        super::audit::begin(
            if revoke { "revoke_key" } else { "retire_key" },
            Some(key_id),
        );
        require_admin(principal)?;
        let identity = self.identity().ok_or_else(|| {
            ServiceError::NotFound(format!("no key {key_id}: the registry has no keys yet"))
        })?;
        if identity.keys.iter().all(|k| k.key_id != key_id) {
            return Err(ServiceError::NotFound(format!("no key {key_id}")));
        }
        let key_id = key_id.to_string();
        let change = if revoke {
            IdentityChange::Revoke { key_id }
        } else {
            IdentityChange::Retire { key_id }
        };
        let resigned = self.propose_identity(change).await?;
        self.identity_after_change(resigned)
    }

    /// Makes sure the cluster has an identity and holds the operator's keys:
    /// retried until it is so or the server stops. Runs on every node.
    pub async fn establish_identity(self, settings: IdentitySettings) {
        let mut shutdown = self.shutdown_signal();
        let mut delay = Duration::from_millis(200);
        loop {
            match self.establish_once(&settings).await {
                Ok(()) => return,
                Err(e) => {
                    warn!(error = %e, "could not establish the registry identity yet; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    async fn establish_once(&self, settings: &IdentitySettings) -> Result<()> {
        let current = self.identity();
        let change = match (&settings.key_file, &current) {
            (Some(file), Some(current)) => {
                // Import only keys the identity lacks.
                let missing = file.keys.iter().any(|k| {
                    crate::crypto::keys::public_key_id(&k.secret)
                        .is_some_and(|id| current.keys.iter().all(|c| c.key_id != id))
                });
                if !missing {
                    return Ok(());
                }
                IdentityChange::Establish {
                    authority: current.authority.clone(),
                    keys: file.keys.clone(),
                    imported: true,
                }
            }
            (Some(file), None) => IdentityChange::Establish {
                authority: settings
                    .authority
                    .clone()
                    .or_else(|| file.authority.clone())
                    .unwrap_or_else(|| settings.fallback_authority.clone()),
                keys: file.keys.clone(),
                imported: true,
            },
            (None, Some(_)) => return Ok(()),
            (None, None) => IdentityChange::Establish {
                authority: settings
                    .authority
                    .clone()
                    .unwrap_or_else(|| settings.fallback_authority.clone()),
                keys: vec![NewKey::generate().map_err(|e| ServiceError::Internal(e.to_string()))?],
                imported: false,
            },
        };
        self.propose_identity(change).await?;
        if let Some(identity) = self.identity() {
            if let Some(configured) = settings
                .authority
                .as_ref()
                .filter(|a| **a != identity.authority)
            {
                warn!(
                    %configured,
                    established = %identity.authority,
                    "the configured authority differs from the cluster's; the cluster's stands"
                );
            }
            info!(authority = %identity.authority, signing_key = %identity.signing_key, "registry identity established");
        }
        Ok(())
    }
}
