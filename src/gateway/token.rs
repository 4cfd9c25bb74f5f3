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

use std::time::{Duration, Instant};

use serde::Deserialize;
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

/// One client's tokens from one token endpoint.
pub struct ClientCredentials {
    token_url: Url,
    client_id: String,
    client_secret: String,
    /// Sent in the form instead of HTTP Basic.
    secret_in_form: bool,
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
        let client_secret = match (&c.client_secret, &c.client_secret_env) {
            (Some(s), None) => s.clone(),
            (None, Some(var)) => std::env::var(var)
                .map_err(|_| format!("oauth2: environment variable {var} is not set"))?,
            _ => {
                return Err(
                    "oauth2: give exactly one of client_secret and client_secret_env".into(),
                )
            }
        };
        let secret_in_form = match c.client_auth.as_deref() {
            None | Some("basic") => false,
            Some("post") => true,
            Some(other) => {
                return Err(format!(
                    "oauth2.client_auth '{other}': use basic (client_secret_basic) or post (client_secret_post)"
                ))
            }
        };
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
            client_secret,
            secret_in_form,
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
        if self.secret_in_form {
            form.push(("client_id", &self.client_id));
            form.push(("client_secret", &self.client_secret));
        } else {
            // RFC 6749 2.3.1: both are form-encoded before Basic encoding.
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            req = req.basic_auth(enc(&self.client_id), Some(enc(&self.client_secret)));
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::gateway::outbound::{system_lookup, OutboundPolicy};

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
                audience: None,
                resource: None,
                client_auth: None,
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
