//! `agentry health`: a container's HEALTHCHECK without curl in the image.
//! The node probes itself over loopback, at the address it listens on.

use std::time::Duration;

use clap::Args;

use super::{local, CliError};

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// URL to probe. Default: this node's HTTP listener
    /// (`AGENTRY_HTTP_ADDR`, an unspecified address probed on loopback;
    /// https when `AGENTRY_TLS_CERT` is set). A URL without a path gets
    /// /healthz, or /readyz with --ready.
    #[arg(long)]
    pub url: Option<String>,
    /// Probe /readyz (a leader is known, the disk has room) instead of
    /// /healthz (the process can serve; a restart would not help otherwise).
    #[arg(long)]
    pub ready: bool,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    pub timeout: u64,
    /// PEM CA certificate for an https `--url`.
    #[arg(long, env = "AGENTRY_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// Exits 0 when the URL answers 200, else fails with the answer.
pub async fn run_health(args: HealthArgs) -> Result<(), CliError> {
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(args.timeout));
    let url = match &args.url {
        Some(url) => {
            if let Some(ca) = &args.ca_file {
                let pem = std::fs::read(ca)
                    .map_err(|e| local(format!("cannot read {}: {e}", ca.display())))?;
                client = client
                    .add_root_certificate(reqwest::Certificate::from_pem(&pem).map_err(local)?);
            }
            with_probe_path(url, path)
        }
        None => {
            let tls = std::env::var_os("AGENTRY_TLS_CERT").is_some_and(|v| !v.is_empty());
            // The node's own certificate names its public host, not
            // loopback: a self-probe checks liveness, not identity.
            client = client.danger_accept_invalid_certs(tls);
            let addr = std::env::var("AGENTRY_HTTP_ADDR").unwrap_or_default();
            self_url(&addr, tls, path)
        }
    };
    let client = client.build().map_err(local)?;
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| local(format!("{url}: {}", crate::error_chain(&e))))?;
    let status = resp.status();
    if status == reqwest::StatusCode::OK {
        return Ok(());
    }
    let body = resp.text().await.unwrap_or_default();
    Err(local(format!("{url} answered {status}: {body}")))
}

/// The URL of this node's own listener at `addr` (`host:port`; empty: the
/// default), an unspecified host replaced by loopback.
/// `url` with the probe's path when it names none (`http://host:8470` or
/// `…/`); a URL with a path is probed as given.
fn with_probe_path(url: &str, path: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.path() == "/" || u.path().is_empty() => {
            u.set_path(path);
            u.to_string()
        }
        _ => url.to_string(),
    }
}

fn self_url(addr: &str, tls: bool, path: &str) -> String {
    let addr: std::net::SocketAddr = addr
        .parse()
        .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 8470)));
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!(
        "{scheme}://{}{path}",
        std::net::SocketAddr::new(ip, addr.port())
    )
}

#[cfg(test)]
mod tests {
    use super::{self_url, with_probe_path};

    #[test]
    fn a_url_without_a_path_gets_the_probe_path() {
        assert_eq!(
            with_probe_path("http://10.0.0.5:8470", "/readyz"),
            "http://10.0.0.5:8470/readyz"
        );
        assert_eq!(
            with_probe_path("https://r.example/", "/healthz"),
            "https://r.example/healthz"
        );
        assert_eq!(
            with_probe_path("http://10.0.0.5:8470/healthz", "/readyz"),
            "http://10.0.0.5:8470/healthz"
        );
    }

    #[test]
    fn probes_its_own_listener_on_loopback() {
        assert_eq!(
            self_url("0.0.0.0:9000", false, "/healthz"),
            "http://127.0.0.1:9000/healthz"
        );
        assert_eq!(
            self_url("[::]:9000", true, "/readyz"),
            "https://[::1]:9000/readyz"
        );
        assert_eq!(
            self_url("", false, "/healthz"),
            "http://127.0.0.1:8470/healthz"
        );
        assert_eq!(
            self_url("10.0.0.5:81", false, "/healthz"),
            "http://10.0.0.5:81/healthz"
        );
    }
}
