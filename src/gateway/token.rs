//! OAuth 2.0 client credentials towards agents (RFC 6749 4.4). For the
//! agents a credential names, the gateway gets its own access token from
//! the organisation's token endpoint instead of every caller bringing one.
//! This is what an A2A agent that declares an `oauth2SecurityScheme` with a
//! client-credentials flow expects of a service that calls it.
//!
//! - **Reuse.** A token is reused until shortly before it expires.
//! - **One fetch at a time.** Concurrent calls wait for that one fetch.
//! - **Refusal.** A token is dropped when an agent answers 401 with it, so
//!   the next call gets a fresh one (the refused call is not retried: an
//!   invocation need not be idempotent).
//! - **Guard.** The token endpoint is reached through the same outbound
//!   guard and TLS as the agents.
//! - **Proof.** The gateway proves itself with the client secret (HTTP
//!   Basic or the form), or with an assertion signed by its private key
//!   (`private_key_jwt`, RFC 7523 2.2), which providers offer so that no
//!   shared secret sits in the gateway's configuration or crosses the
//!   wire: each assertion names the token endpoint, lives a minute and
//!   has its own `jti`, so a captured one is no use elsewhere or later.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use url::Url;

use super::outbound::{classify, read_limited, redacted};
use super::transport::{GatewayError, Outbound};
use crate::config::ClientCredentialsConfig;

/// Tokens are renewed this long before they expire (a quarter of a
/// shorter lifetime), so a call never leaves with one about to lapse.
const RENEW_BEFORE: Duration = Duration::from_secs(30);
/// The lifetime assumed when the token endpoint names none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// Lifetimes beyond a day are taken as a day.
const MAX_LIFETIME_SECS: u64 = 86_400;
/// The largest token response read.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;
/// How long a client assertion is valid: one token request, with room for
/// the provider's clock to differ.
const ASSERTION_LIFETIME_SECS: u64 = 60;
/// `client_assertion_type` of a signed JWT (RFC 7523 2.2).
const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// How the gateway proves itself to the token endpoint.
enum ClientAuth {
    /// The secret in HTTP Basic (RFC 6749 2.3.1).
    Basic(String),
    /// The secret in the form.
    Post(String),
    /// A fresh assertion signed with the client's key for each request.
    PrivateKeyJwt(Box<Signer>),
}

struct Signer {
    key: EncodingKey,
    header: Header,
    /// The assertion's `aud`: the token endpoint unless configured.
    audience: String,
}

/// The claims of a client assertion (RFC 7523 3): the client is both
/// issuer and subject.
#[derive(Serialize)]
struct Assertion<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    jti: String,
    iat: u64,
    exp: u64,
}

/// One client's tokens from one token endpoint.
pub struct ClientCredentials {
    token_url: Url,
    client_id: String,
    auth: ClientAuth,
    /// Extra form members: `scope`, `audience`, `resource`.
    extra: Vec<(&'static str, String)>,
    outbound: Outbound,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    token: Option<Token>,
    /// The last fetch that failed, and when.
    failed: Option<(Instant, GatewayError)>,
}

struct Token {
    bearer: String,
    renew_at: Instant,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: String,
    /// Seconds; a number, or a numeric string (as some providers send).
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct TokenError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl ClientCredentials {
    /// Reads the configuration (the secret from its variable, once).
    pub fn new(c: &ClientCredentialsConfig, outbound: Outbound) -> Result<Self, String> {
        let token_url = Url::parse(&c.token_url)
            .map_err(|e| format!("oauth2.token_url '{}' is not a URL: {e}", c.token_url))?;
        outbound
            .policy
            .check_url(&token_url)
            .map_err(|e| format!("oauth2.token_url: {e}"))?;
        let auth = client_auth(c)?;
        let mut extra = Vec::new();
        if !c.scopes.is_empty() {
            extra.push(("scope", c.scopes.join(" ")));
        }
        if let Some(a) = &c.audience {
            extra.push(("audience", a.clone()));
        }
        if let Some(r) = &c.resource {
            extra.push(("resource", r.clone()));
        }
        Ok(Self {
            token_url,
            client_id: c.client_id.clone(),
            auth,
            extra,
            outbound,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    /// The `Authorization` value for the next call: the token in hand, or
    /// a new one.
    pub async fn bearer(&self) -> Result<String, GatewayError> {
        let asked = Instant::now();
        let mut state = self.state.lock().await;
        if let Some(t) = state.token.as_ref().filter(|t| asked < t.renew_at) {
            return Ok(t.bearer.clone());
        }
        // A fetch that failed while this call waited for it answers this
        // call too: callers queued behind an endpoint that is down never
        // wait for one failing fetch each.
        if let Some((at, e)) = &state.failed {
            if *at >= asked {
                return Err(e.clone());
            }
        }
        match self.fetch().await {
            Ok(token) => {
                let bearer = token.bearer.clone();
                *state = State {
                    token: Some(token),
                    failed: None,
                };
                Ok(bearer)
            }
            Err(e) => {
                state.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// An agent refused `bearer`: it is not offered again.
    pub async fn refused(&self, bearer: &str) {
        let mut state = self.state.lock().await;
        if state.token.as_ref().is_some_and(|t| t.bearer == bearer) {
            state.token = None;
        }
    }

    async fn fetch(&self) -> Result<Token, GatewayError> {
        let url = &self.token_url;
        let timeout = self.outbound.policy.timeout;
        let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
        form.extend(self.extra.iter().map(|(k, v)| (*k, v.as_str())));
        let mut req = self
            .outbound
            .client()
            .post(url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(timeout);
        let assertion;
        match &self.auth {
            ClientAuth::Basic(secret) => {
                // RFC 6749 2.3.1: both are form-encoded before Basic encoding.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                req = req.basic_auth(enc(&self.client_id), Some(enc(secret)));
            }
            ClientAuth::Post(secret) => {
                form.push(("client_id", &self.client_id));
                form.push(("client_secret", secret));
            }
            ClientAuth::PrivateKeyJwt(s) => {
                assertion = sign_assertion(&s.key, &s.header, &self.client_id, &s.audience)
                    .map_err(GatewayError::Unsupported)?;
                form.push(("client_id", &self.client_id));
                form.push(("client_assertion_type", ASSERTION_TYPE));
                form.push(("client_assertion", &assertion));
            }
        }
        let started = Instant::now();
        let resp = req
            .form(&form)
            .send()
            .await
            .map_err(|e| classify(&e, url, timeout))?;
        let status = resp.status();
        let body = read_limited(resp, MAX_TOKEN_RESPONSE, timeout).await?;
        let target = redacted(url);
        if !status.is_success() {
            let why = serde_json::from_slice::<TokenError>(&body)
                .map(|e| match e.error_description {
                    Some(d) => format!("{}: {d}", e.error),
                    None => e.error,
                })
                .unwrap_or_else(|_| format!("HTTP {}", status.as_u16()));
            return Err(GatewayError::BadAnswer(format!(
                "the token endpoint {target} refused client '{}': {why}",
                self.client_id
            )));
        }
        let t: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            GatewayError::BadAnswer(format!(
                "the token endpoint {target} answered no token: {e}"
            ))
        })?;
        if !t.token_type.eq_ignore_ascii_case("bearer") {
            return Err(GatewayError::BadAnswer(format!(
                "the token endpoint {target} issued a '{}' token; the gateway sends bearer tokens",
                t.token_type
            )));
        }
        let lifetime = t
            .expires_in
            .as_ref()
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.trim().parse().ok()))
            .map(|s| Duration::from_secs(s.min(MAX_LIFETIME_SECS)))
            .unwrap_or(DEFAULT_LIFETIME);
        let early = RENEW_BEFORE.min(lifetime / 4);
        tracing::debug!(token_endpoint = %target, lifetime_secs = lifetime.as_secs(), "gateway token fetched");
        Ok(Token {
            bearer: format!("Bearer {}", t.access_token),
            renew_at: started + lifetime - early,
        })
    }
}

/// The proof the configuration names, read now: the secret from its
/// variable, or the private key from its file (signed with once, so a key
/// that cannot sign with its algorithm stops the start rather than the
/// first call).
fn client_auth(c: &ClientCredentialsConfig) -> Result<ClientAuth, String> {
    let method = c.client_auth.as_deref().unwrap_or("basic");
    if method == "private_key_jwt" {
        let path = c
            .private_key_file
            .as_ref()
            .ok_or("oauth2: private_key_jwt needs private_key_file (a PEM private key)")?;
        let named = |e: String| format!("oauth2.private_key_file {}: {e}", path.display());
        let pem = std::fs::read(path).map_err(|e| named(e.to_string()))?;
        let (key, alg) = signing_key(&pem, c.signing_alg.as_deref()).map_err(named)?;
        let mut header = Header::new(alg);
        header.kid = c.key_id.clone();
        let audience = c
            .assertion_audience
            .clone()
            .unwrap_or_else(|| c.token_url.clone());
        sign_assertion(&key, &header, &c.client_id, &audience).map_err(named)?;
        return Ok(ClientAuth::PrivateKeyJwt(Box::new(Signer {
            key,
            header,
            audience,
        })));
    }
    let secret = match (&c.client_secret, &c.client_secret_env) {
        (Some(s), None) => s.clone(),
        (None, Some(var)) => std::env::var(var)
            .map_err(|_| format!("oauth2: environment variable {var} is not set"))?,
        _ => return Err("oauth2: give exactly one of client_secret and client_secret_env".into()),
    };
    match method {
        "basic" => Ok(ClientAuth::Basic(secret)),
        "post" => Ok(ClientAuth::Post(secret)),
        other => Err(format!(
            "oauth2.client_auth '{other}': use basic (client_secret_basic), post (client_secret_post) or private_key_jwt"
        )),
    }
}

/// The key in `pem` and the algorithm it signs with: `alg` when given and
/// fit for the key, else the key type's usual one.
fn signing_key(pem: &[u8], alg: Option<&str>) -> Result<(EncodingKey, Algorithm), String> {
    use Algorithm::*;
    let (key, fit): (EncodingKey, &[Algorithm]) = if let Ok(k) = EncodingKey::from_ed_pem(pem) {
        (k, &[EdDSA])
    } else if let Ok(k) = EncodingKey::from_ec_pem(pem) {
        (k, &[ES256, ES384])
    } else if let Ok(k) = EncodingKey::from_rsa_pem(pem) {
        (k, &[RS256, RS384, RS512, PS256, PS384, PS512])
    } else {
        return Err("not a private key the gateway can sign with: an RSA key (PEM, PKCS #1 or #8), or an EC (P-256, P-384) or Ed25519 key in PKCS #8 ('BEGIN PRIVATE KEY'; convert an 'EC PRIVATE KEY' with openssl pkcs8 -topk8 -nocrypt)".into());
    };
    let alg = match alg {
        None => fit[0],
        Some(name) => name
            .parse::<Algorithm>()
            .ok()
            .filter(|a| fit.contains(a))
            .ok_or_else(|| {
                format!("signing_alg '{name}' does not fit this key; it signs with one of {fit:?}")
            })?,
    };
    Ok((key, alg))
}

/// A client assertion for one token request.
fn sign_assertion(
    key: &EncodingKey,
    header: &Header,
    client_id: &str,
    audience: &str,
) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = Assertion {
        iss: client_id,
        sub: client_id,
        aud: audience,
        jti: uuid::Uuid::new_v4().to_string(),
        iat: now,
        exp: now + ASSERTION_LIFETIME_SECS,
    };
    jsonwebtoken::encode(header, &claims, key)
        .map_err(|e| format!("the client assertion could not be signed ({e})"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::gateway::outbound::{system_lookup, OutboundPolicy};

    /// Test keys, made for these tests only.
    const ED25519_KEY: &str = "-----BEGIN PRIVATE KEY-----\n\
MC4CAQAwBQYDK2VwBCIEID9+Bu0pmxcJ+UDgoJbZAz2SnN2O2hWyM36eiqq8ryam\n\
-----END PRIVATE KEY-----";
    const ED25519_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\n\
MCowBQYDK2VwAyEAmIQH6tF8mSfUZEfMVGsWH9Zu94Kop9+uh2DJvFxyInw=\n\
-----END PUBLIC KEY-----";
    const P256_KEY: &str = "-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg4HbPyXUrJi1QElPR\n\
zIYRWN/I8/gbiUJ90lm7FPGjp/ChRANCAAQNdPrmviSfvwWHJt+wmcYq0JpWdt97\n\
CoZDOdj0xGLQR40c5adWOYORbhnxGeobxSIDKo+NTVNRHUhcHIGfReyH\n\
-----END PRIVATE KEY-----";
    const P256_SEC1_KEY: &str = "-----BEGIN EC PRIVATE KEY-----\n\
MHcCAQEEIOB2z8l1KyYtUBJT0cyGEVjfyPP4G4lCfdJZuxTxo6fwoAoGCCqGSM49\n\
AwEHoUQDQgAEDXT65r4kn78FhybfsJnGKtCaVnbfewqGQznY9MRi0EeNHOWnVjmD\n\
kW4Z8RnqG8UiAyqPjU1TUR1IXByBn0Xshw==\n\
-----END EC PRIVATE KEY-----";

    #[test]
    fn an_assertion_names_the_client_and_the_endpoint_and_is_new_each_time() {
        let (key, alg) = signing_key(ED25519_KEY.as_bytes(), None).unwrap();
        assert_eq!(alg, Algorithm::EdDSA);
        let mut header = Header::new(alg);
        header.kid = Some("gw-key-1".into());
        let endpoint = "https://id.example/oauth2/token";
        let first = sign_assertion(&key, &header, "gw", endpoint).unwrap();
        let second = sign_assertion(&key, &header, "gw", endpoint).unwrap();
        let mut check = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        check.set_audience(&[endpoint]);
        check.set_issuer(&["gw"]);
        check.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let public = jsonwebtoken::DecodingKey::from_ed_pem(ED25519_PUBLIC.as_bytes()).unwrap();
        let read = |jwt: &str| {
            jsonwebtoken::decode::<serde_json::Value>(jwt, &public, &check)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let (a, b) = (read(&first), read(&second));
        assert_eq!(a.header.kid.as_deref(), Some("gw-key-1"));
        assert_eq!(a.claims["sub"], "gw");
        let lifetime = a.claims["exp"].as_u64().unwrap() - a.claims["iat"].as_u64().unwrap();
        assert_eq!(lifetime, ASSERTION_LIFETIME_SECS);
        assert!(a.claims["jti"].as_str().is_some_and(|j| !j.is_empty()));
        assert_ne!(a.claims["jti"], b.claims["jti"], "a replay is told apart");
    }

    #[test]
    fn a_key_signs_with_its_own_kind_of_algorithm() {
        let alg = |pem: &str, asked| signing_key(pem.as_bytes(), asked).map(|(_, a)| a);
        assert_eq!(alg(P256_KEY, None).unwrap(), Algorithm::ES256);
        assert_eq!(alg(P256_KEY, Some("ES384")).unwrap(), Algorithm::ES384);
        let e = alg(P256_KEY, Some("RS256")).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
        let e = alg(P256_KEY, Some("HS256")).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
        let e = alg(P256_SEC1_KEY, None).unwrap_err();
        assert!(e.contains("openssl pkcs8 -topk8"), "{e}");
        let e = alg("not a key", None).unwrap_err();
        assert!(e.contains("not a private key"), "{e}");
        // A P-256 key cannot make an ES384 signature: found when the
        // configuration is read, not at the first call.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p256.pem");
        std::fs::write(&file, P256_KEY).unwrap();
        let config = |alg: &str| ClientCredentialsConfig {
            token_url: "https://id.example/token".into(),
            client_id: "gw".into(),
            client_auth: Some("private_key_jwt".into()),
            private_key_file: Some(file.clone()),
            signing_alg: Some(alg.into()),
            ..Default::default()
        };
        assert!(client_auth(&config("ES256")).is_ok());
        let e = client_auth(&config("ES384")).err().unwrap();
        assert!(e.contains("could not be signed"), "{e}");
    }

    /// Calls queued behind a token endpoint that does not answer share the
    /// one fetch's failure instead of each waiting for a fetch of its own.
    #[tokio::test]
    async fn callers_waiting_for_a_failing_fetch_share_its_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        let policy = OutboundPolicy {
            allow_http: true,
            timeout: Duration::from_millis(300),
            ..Default::default()
        }
        .allow(&["127.0.0.1".into()])
        .unwrap();
        let outbound = Outbound::new(policy, system_lookup(), Default::default()).unwrap();
        let source = ClientCredentials::new(
            &ClientCredentialsConfig {
                token_url: format!("http://127.0.0.1:{port}/token"),
                client_id: "gw".into(),
                client_secret: Some("s".into()),
                client_secret_env: None,
                scopes: Vec::new(),
                ..Default::default()
            },
            outbound,
        )
        .unwrap();
        let calls = (0..5).map(|_| source.bearer());
        let results = futures::future::join_all(calls).await;
        assert!(
            results.iter().all(|r| r.is_err()),
            "no token from a silent endpoint"
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one fetch for five callers"
        );
        // A later call tries again.
        assert!(source.bearer().await.is_err());
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
