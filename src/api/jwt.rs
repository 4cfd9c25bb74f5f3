//! OIDC / JWT bearer tokens: signatures checked against the issuer's JWKS
//! (a file, or the issuer's URL fetched through the gateway's outbound
//! guard, cached and refreshed when a token names a key id not seen yet),
//! then issuer, audience, expiry and not-before. Only asymmetric algorithms
//! are accepted (RS256, ES256, EdDSA): `alg: none` and HMAC tokens are
//! refused before any key is looked at, so a public key can never be used
//! as an HMAC secret. The JWS work is jsonwebtoken's, not ours.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;
use sha2::Digest;

use crate::domain::{Principal, Role};
use crate::gateway::transport::Outbound;
use crate::listener::FileStamps;

/// `[jwt]`: one token issuer.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` every token must carry (the OIDC issuer URL).
    pub issuer: String,
    /// Accepted `aud` values; a token must name at least one.
    pub audiences: Vec<String>,
    /// A JWKS file (re-read when it changes).
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// The issuer's JWKS URL (e.g. `https://id.example/.well-known/jwks.json`),
    /// fetched through `[gateway.outbound]`'s guard.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The claim naming the principal.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// A claim holding the role (`admin`, `publisher`, `reader`, or an
    /// array of them: the strongest counts). Absent: `default_role`.
    #[serde(default)]
    pub role_claim: Option<String>,
    #[serde(default = "default_role")]
    pub default_role: Role,
    /// A claim naming the principal's tenant (e.g. `org_id`); absent or
    /// unset: the principal belongs to no tenant.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
    /// Fetches of `jwks_url` are at least this far apart, so a flood of
    /// tokens with made-up key ids is not a flood of fetches.
    #[serde(default = "default_min_refresh")]
    pub jwks_min_refresh_secs: u64,
}

fn default_min_refresh() -> u64 {
    30
}

fn default_principal_claim() -> String {
    "sub".into()
}

fn default_role() -> Role {
    Role::Reader
}

fn default_leeway() -> u64 {
    30
}

impl JwtConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.issuer.trim().is_empty() {
            return Err("jwt.issuer must not be empty".into());
        }
        if self.audiences.is_empty() {
            return Err("jwt.audiences must name at least one audience".into());
        }
        match (&self.jwks_file, &self.jwks_url) {
            (None, None) => Err("jwt: give jwks_file or jwks_url".into()),
            (Some(_), Some(_)) => Err("jwt: give one of jwks_file and jwks_url".into()),
            (None, Some(u)) if url::Url::parse(u).is_err() => {
                Err(format!("jwt.jwks_url '{u}' is not a URL"))
            }
            _ if self.jwks_min_refresh_secs == 0 => {
                Err("jwt.jwks_min_refresh_secs must be at least 1".into())
            }
            _ => Ok(()),
        }
    }
}

/// The algorithms a token may be signed with.
const ALLOWED: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("{0}")]
    Refused(String),
}

fn refused(m: impl Into<String>) -> JwtError {
    JwtError::Refused(m.into())
}

struct Keys {
    set: JwkSet,
    fetched: Option<Instant>,
}

/// A token already verified: its principal and validity window. Clients
/// send the same token until it expires, so the signature is checked once.
struct Verified {
    principal: Principal,
    not_before: i64,
    expires: i64,
}

/// Tokens remembered as verified; past this, the memory starts afresh.
const VERIFIED_CAPACITY: usize = 10_000;

/// Checks tokens of one issuer.
pub struct JwtVerifier {
    config: JwtConfig,
    outbound: Option<Outbound>,
    keys: RwLock<Keys>,
    /// The JWKS file's modification time, when keys come from a file.
    file: Option<std::sync::Mutex<FileStamps>>,
    /// By SHA-256 of the token; emptied whenever the key set changes, so a
    /// key taken out of the set stops its tokens at once.
    verified: std::sync::Mutex<std::collections::HashMap<[u8; 32], Verified>>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

impl JwtVerifier {
    /// Loads the JWKS file now (a bad file stops the start); a URL is
    /// fetched on the first token.
    pub fn new(config: JwtConfig, outbound: Option<Outbound>) -> Result<Arc<Self>, String> {
        config.validate()?;
        let mut keys = Keys {
            set: JwkSet { keys: Vec::new() },
            fetched: None,
        };
        let mut file = None;
        if let Some(path) = &config.jwks_file {
            keys.set = read_jwks(path)?;
            file = Some(std::sync::Mutex::new(FileStamps::new(vec![path.clone()])));
        }
        if config.jwks_url.is_some() && outbound.is_none() {
            return Err("jwt.jwks_url needs the gateway's outbound client".into());
        }
        Ok(Arc::new(Self {
            config,
            outbound,
            keys: RwLock::new(keys),
            file,
            verified: std::sync::Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
        }))
    }

    /// Whether a bearer credential looks like a JWT (three base64url parts)
    /// rather than an API key.
    pub fn looks_like_jwt(credential: &str) -> bool {
        credential.starts_with("eyJ") && credential.matches('.').count() == 2
    }

    /// The principal a valid token names.
    pub async fn verify(self: &Arc<Self>, token: &str) -> Result<Principal, JwtError> {
        self.reload_file();
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = unix_now();
        let leeway = i64::try_from(self.config.leeway_secs).unwrap_or(i64::MAX);
        if let Some(v) = self.lock_verified().get(&digest) {
            if now + leeway >= v.not_before && now - leeway < v.expires {
                return Ok(v.principal.clone());
            }
        }
        let verified = self.verify_signed(token).await?;
        let principal = verified.principal.clone();
        let mut cache = self.lock_verified();
        if cache.len() >= VERIFIED_CAPACITY {
            cache.clear();
        }
        cache.insert(digest, verified);
        Ok(principal)
    }

    fn lock_verified(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<[u8; 32], Verified>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the signature and claims of a token not seen before.
    async fn verify_signed(self: &Arc<Self>, token: &str) -> Result<Verified, JwtError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| refused(format!("malformed token: {e}")))?;
        if !ALLOWED.contains(&header.alg) {
            return Err(refused(format!(
                "tokens signed with {:?} are not accepted (RS256, ES256, EdDSA only)",
                header.alg
            )));
        }
        let kid = header.kid.clone().unwrap_or_default();
        let key = match self.key(&kid, header.alg) {
            Some(k) => k,
            None => {
                // The fetch runs in a task of its own: a request given up
                // at its deadline does not cancel it, so the keys and the
                // time of the fetch are still recorded, and the requests
                // after it wait for that fetch instead of starting another.
                let this = self.clone();
                let _ = tokio::spawn(async move { this.refresh().await }).await;
                self.key(&kid, header.alg)
                    .ok_or_else(|| refused(format!("unknown signing key '{kid}'")))?
            }
        }?;
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&self.config.audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v.leeway = self.config.leeway_secs;
        let data = jsonwebtoken::decode::<Value>(token, &key, &v)
            .map_err(|e| refused(format!("invalid token: {e}")))?;
        let claim = |name: &str| data.claims.get(name).and_then(Value::as_i64);
        Ok(Verified {
            principal: self.principal(&data.claims)?,
            not_before: claim("nbf").unwrap_or(i64::MIN),
            expires: claim("exp").unwrap_or(i64::MIN),
        })
    }

    /// The key for `kid` and `alg`, if the cached set has one whose type
    /// fits the algorithm.
    fn key(&self, kid: &str, alg: Algorithm) -> Option<Result<DecodingKey, JwtError>> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let jwk = if kid.is_empty() && keys.set.keys.len() == 1 {
            keys.set.keys.first()
        } else {
            keys.set.find(kid)
        }?;
        if let Some(key_alg) = jwk.common.key_algorithm {
            if format!("{key_alg:?}") != format!("{alg:?}") {
                return Some(Err(refused(format!(
                    "key '{kid}' is for {key_alg:?}, the token says {alg:?}"
                ))));
            }
        }
        Some(DecodingKey::from_jwk(jwk).map_err(|e| refused(format!("unusable key '{kid}': {e}"))))
    }

    /// Re-reads the JWKS file when it changed (looked at once a second).
    fn reload_file(&self) {
        let (Some(path), Some(file)) = (&self.config.jwks_file, &self.file) else {
            return;
        };
        let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(stamps) = file.changed() else {
            return;
        };
        match read_jwks(path) {
            Ok(set) => {
                self.keys.write().unwrap_or_else(|p| p.into_inner()).set = set;
                file.settle(stamps);
                self.lock_verified().clear();
            }
            Err(e) => {
                tracing::warn!(error = %e, "the JWKS file changed but cannot be read; keeping the previous keys")
            }
        }
    }

    /// Fetches the JWKS URL again, unless it was fetched moments ago.
    async fn refresh(&self) {
        let (Some(url), Some(outbound)) = (&self.config.jwks_url, &self.outbound) else {
            return;
        };
        let _one = self.refreshing.lock().await;
        let recent = self
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .fetched
            .is_some_and(|t| t.elapsed() < Duration::from_secs(self.config.jwks_min_refresh_secs));
        if recent {
            return;
        }
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(_) => return,
        };
        let fetched = outbound.fetch(&parsed, "application/json", &[]).await;
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.fetched = Some(Instant::now());
        match fetched {
            Ok(f) if f.status == 200 => match serde_json::from_slice::<JwkSet>(&f.body) {
                Ok(set) => {
                    keys.set = set;
                    self.lock_verified().clear();
                }
                Err(e) => tracing::warn!(%url, error = %e, "the issuer's JWKS is not a JWK set"),
            },
            Ok(f) => {
                tracing::warn!(%url, status = f.status, "the issuer's JWKS could not be fetched")
            }
            Err(e) => tracing::warn!(%url, error = %e, "the issuer's JWKS could not be fetched"),
        }
    }

    fn principal(&self, claims: &Value) -> Result<Principal, JwtError> {
        let name = claims
            .get(&self.config.principal_claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                refused(format!(
                    "the token has no '{}' claim naming the principal",
                    self.config.principal_claim
                ))
            })?;
        let role = match self.config.role_claim.as_ref().and_then(|c| claims.get(c)) {
            None => self.config.default_role,
            Some(v) => strongest_role(v)
                .ok_or_else(|| refused(format!("the token's role claim {v} names no role")))?,
        };
        let tenant = match self
            .config
            .tenant_claim
            .as_ref()
            .and_then(|c| claims.get(c))
        {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) if !t.is_empty() && !t.contains(['/', ':']) => Some(t.clone()),
            Some(v) => {
                return Err(refused(format!(
                    "the token's tenant claim {v} is not a tenant name"
                )))
            }
        };
        Ok(Principal::new(name, role).in_tenant(tenant))
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The strongest role a claim names (a string or an array of strings).
fn strongest_role(v: &Value) -> Option<Role> {
    let names: Vec<&str> = match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let rank = |r: Role| match r {
        Role::Admin => 3,
        Role::Publisher => 2,
        Role::Reader => 1,
    };
    names
        .into_iter()
        .filter_map(Role::parse)
        .max_by_key(|r| rank(*r))
}

fn read_jwks(path: &std::path::Path) -> Result<JwkSet, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("jwt.jwks_file {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("jwt.jwks_file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_from_claims() {
        assert_eq!(strongest_role(&json!("publisher")), Some(Role::Publisher));
        assert_eq!(
            strongest_role(&json!(["reader", "admin", "x"])),
            Some(Role::Admin)
        );
        assert_eq!(strongest_role(&json!(["x"])), None);
        assert!(JwtVerifier::looks_like_jwt("eyJhbGciOi.eyJzdWIi.c2ln"));
        assert!(!JwtVerifier::looks_like_jwt("agk_0123456789abcdef"));
    }
}
