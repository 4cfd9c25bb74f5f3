//! `agentry keys …` (make a key file; list, rotate, retire and revoke the
//! registry's keys) and `agentry verify` (check a record's signature
//! offline, with nothing but the record and the registry's public keys).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{local, CliError, ClientArgs};
use crate::api::federation::registry_info_to_json;
use crate::crypto::signature::{signature_of, verify_served, verify_with_identity};
use crate::crypto::{Identity, KeyFile, NewKey};
use crate::pb::{self, federation_client::FederationClient};

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a new key file (JSON) for `[identity] key_file`, e.g. to store
    /// as a Kubernetes secret that every node of a cluster mounts.
    Generate {
        /// The operator's DNS name to record in the file.
        #[arg(long)]
        authority: Option<String>,
    },
    /// The registry's authority and keys (as `/.well-known/agentry.json`).
    List,
    /// Add a new signing key; older keys keep verifying.
    Rotate {
        /// RFC 3339 end of the new key's validity.
        #[arg(long)]
        not_after: Option<String>,
    },
    /// Retire a key that no longer signs (its records are signed again).
    Retire { key_id: String },
    /// Revoke a compromised key (its records are signed again).
    Revoke { key_id: String },
    /// Sign agent metadata as its publisher (ADP `signature`) with a key
    /// file's last key; prints the signed metadata.
    SignMetadata {
        /// The metadata JSON, or '-' for stdin.
        file: String,
        /// A key file from `agentry keys generate`.
        #[arg(long)]
        key_file: PathBuf,
    },
    /// Register a publisher key (the last key of a key file) for agent id
    /// prefixes.
    AddPublisherKey {
        #[arg(long)]
        key_file: PathBuf,
        /// An agent id prefix the key vouches for (repeatable).
        #[arg(long = "namespace", required = true)]
        namespaces: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A record as served (`GET /agents/{id}`, `agentry agents get --json`),
    /// or '-' for stdin.
    pub file: String,
    /// A trusted public key (base64url), repeatable: checks the signature
    /// only. A base64url key may begin with '-', so the value is taken as
    /// given rather than read as a flag.
    #[arg(long = "key", allow_hyphen_values = true)]
    pub keys: Vec<String>,
    /// A saved `/.well-known/agentry.json`: also checks the authority, the
    /// key's state and its validity window.
    #[arg(long)]
    pub registry_info: Option<PathBuf>,
}

/// The seed of a key file's signing (last) key.
fn signing_secret(key_file: &std::path::Path) -> Result<String, CliError> {
    let keys = KeyFile::read(key_file).map_err(local)?;
    Ok(keys
        .keys
        .last()
        .map(|k| k.secret.clone())
        .unwrap_or_default())
}

fn print_json(v: &Value) -> Result<(), CliError> {
    out!("{}", serde_json::to_string_pretty(v).map_err(local)?);
    Ok(())
}

pub async fn run_keys(args: KeysArgs) -> Result<(), CliError> {
    if let KeysCommand::Generate { authority } = &args.command {
        let file = KeyFile {
            authority: authority.clone(),
            keys: vec![NewKey::generate().map_err(local)?],
        };
        return print_json(&serde_json::to_value(file).map_err(local)?);
    }
    if let KeysCommand::SignMetadata { file, key_file } = &args.command {
        let text = read_input(file)?;
        let mut metadata: crate::domain::AgentMetadata =
            serde_json::from_str(&text).map_err(|e| local(format!("{file}: {e}")))?;
        let secret = signing_secret(key_file)?;
        crate::crypto::publisher::sign_metadata(&mut metadata, &secret).map_err(local)?;
        return print_json(&serde_json::to_value(&metadata).map_err(local)?);
    }
    let (_, channel) = args.client.connect(0).await?;
    let mut client = FederationClient::new(channel);
    let c = &args.client;
    if let KeysCommand::AddPublisherKey {
        key_file,
        namespaces,
    } = &args.command
    {
        let secret = signing_secret(key_file)?;
        let public = crate::crypto::keys::public_key_of(&secret).map_err(local)?;
        let key = client
            .add_publisher_key(c.request(pb::AddPublisherKeyRequest {
                public_key: public,
                namespaces: namespaces.clone(),
                principal: None,
            })?)
            .await?
            .into_inner();
        return print_json(&crate::api::federation::publisher_key_to_json(&key));
    }
    let (info, resigned) = match &args.command {
        KeysCommand::Generate { .. }
        | KeysCommand::List
        | KeysCommand::SignMetadata { .. }
        | KeysCommand::AddPublisherKey { .. } => (
            client
                .get_registry_info(c.request(pb::GetRegistryInfoRequest {})?)
                .await?
                .into_inner(),
            None,
        ),
        KeysCommand::Rotate { not_after } => {
            let msg = pb::RotateKeyRequest {
                not_after: not_after.clone(),
            };
            let r = client.rotate_key(c.request(msg)?).await?.into_inner();
            (r.info.unwrap_or_default(), Some(r.resigned))
        }
        KeysCommand::Retire { key_id } | KeysCommand::Revoke { key_id } => {
            let msg = c.request(pb::EndKeyRequest {
                key_id: key_id.clone(),
            })?;
            let r = if matches!(args.command, KeysCommand::Revoke { .. }) {
                client.revoke_key(msg).await?
            } else {
                client.retire_key(msg).await?
            }
            .into_inner();
            (r.info.unwrap_or_default(), Some(r.resigned))
        }
    };
    if c.json {
        return print_json(&registry_info_to_json(&info));
    }
    out!("authority: {}", info.authority);
    for k in &info.keys {
        let signing = if k.key_id == info.signing_key {
            "  (signs)"
        } else {
            ""
        };
        out!(
            "{}  {:<8} {}  since {}{}",
            k.key_id,
            k.state,
            k.public_key,
            k.not_before,
            signing
        );
    }
    if let Some(n) = resigned {
        out!("{n} record(s) signed again");
    }
    Ok(())
}

fn read_input(file: &str) -> Result<String, CliError> {
    if file == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(local)?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).map_err(|e| local(format!("{file}: {e}")))
    }
}

pub fn run_verify(args: VerifyArgs) -> Result<(), CliError> {
    let text = read_input(&args.file)?;
    let record: Value =
        serde_json::from_str(&text).map_err(|e| local(format!("{}: {e}", args.file)))?;
    let sig = signature_of(&record).map_err(local)?;
    if let Some(path) = &args.registry_info {
        let text =
            std::fs::read_to_string(path).map_err(|e| local(format!("{}: {e}", path.display())))?;
        let identity: Identity = serde_json::from_str(&text).map_err(|e| {
            local(format!(
                "{}: not a registry info document: {e}",
                path.display()
            ))
        })?;
        verify_with_identity(&record, &identity).map_err(local)?;
    } else if args.keys.is_empty() {
        return Err(local(
            "give the registry's public key (--key) or its saved /.well-known/agentry.json (--registry-info)",
        ));
    } else {
        let mut last = None;
        let verified = args.keys.iter().any(|k| {
            match crate::crypto::keys::decode_public(k).and_then(|key| verify_served(&record, &key))
            {
                Ok(_) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            }
        });
        if !verified {
            return Err(local(last.map_or("no key given".into(), |e| e.to_string())));
        }
    }
    out!(
        "valid: signed by {} with key {} at {}",
        sig.authority,
        sig.key_id,
        sig.signed_at
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};

    /// One public key in 64 begins with '-' in base64url; `agentry verify`
    /// must take it as the key, not refuse it as an unknown flag.
    #[test]
    fn verify_takes_a_key_that_begins_with_a_hyphen() {
        let key = "-PqW3Yx0nq7u2c8Jm1sV9bKfT4hL6eA5dR0zC2yX1wE";
        let cli = Cli::try_parse_from(["agentry", "verify", "record.json", "--key", key])
            .expect("a hyphen-led key parses");
        let Command::Verify(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(args.keys, vec![key.to_string()]);
        assert_eq!(args.file, "record.json");
    }
}
