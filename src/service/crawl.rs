//! The crawler (WoA 7, ARD §6.2 web ingestion): the leader re-imports each
//! configured source — a WoA host or an AI Catalog — on its interval with
//! a conditional GET (If-None-Match / If-Modified-Since from the last
//! answer), and never sooner than the document's Cache-Control max-age
//! allows. A 304 changes nothing.

use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, info_span, warn, Instrument};

use super::import::{document_url, ImportFormat};
use super::invocation::InvocationService;
use crate::config::{SourceFormat, WoaSourceConfig};
use crate::domain::{Principal, Role};
use crate::gateway::transport::GatewayError;

/// How often a node that is not the leader checks again.
const LEADER_POLL: Duration = Duration::from_secs(1);

/// `max-age` of a Cache-Control value, unless it forbids caching.
fn max_age(cache_control: Option<&str>) -> Option<Duration> {
    let cc = cache_control?.to_ascii_lowercase();
    if cc.contains("no-store") || cc.contains("no-cache") {
        return None;
    }
    cc.split(',')
        .filter_map(|d| d.trim().strip_prefix("max-age="))
        .find_map(|v| v.trim_matches('"').parse().ok())
        .map(Duration::from_secs)
}

/// Crawls one source for as long as the server runs.
pub async fn crawl(
    service: InvocationService,
    source: WoaSourceConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let span = info_span!("crawl", url = %source.url, format = ?source.format);
    async move {
        let format = match source.format {
            SourceFormat::Woa => ImportFormat::Woa,
            SourceFormat::AiCatalog => ImportFormat::AiCatalog,
        };
        let Ok(url) = document_url(format, &source.url) else {
            return;
        };
        let principal = Principal::new(source.owner.clone(), Role::Publisher);
        let interval = Duration::from_secs(source.interval_secs);
        let mut validators: Vec<(&str, String)> = Vec::new();
        loop {
            if *shutdown.borrow() {
                return;
            }
            if !service.registry().is_leader() {
                tokio::select! {
                    _ = tokio::time::sleep(LEADER_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let mut wait = interval;
            match service
                .outbound()
                .fetch(&url, format.accept(), &validators)
                .await
            {
                Err(e) => warn!(error = %e, "crawl failed"),
                Ok(fetched) => {
                    wait = wait.max(max_age(fetched.cache_control.as_deref()).unwrap_or_default());
                    let next: Vec<(&str, String)> = [
                        ("if-none-match", fetched.etag.clone()),
                        ("if-modified-since", fetched.last_modified.clone()),
                    ]
                    .into_iter()
                    .filter_map(|(h, v)| v.map(|v| (h, v)))
                    .collect();
                    match service
                        .import_fetched(&principal, format, &url, fetched)
                        .await
                    {
                        Ok(report) if report.not_modified => {}
                        Ok(report) => {
                            validators = next;
                            let changed = report
                                .agents
                                .iter()
                                .filter(|(_, o)| o != "unchanged")
                                .count();
                            info!(
                                agents = report.agents.len(),
                                changed,
                                skipped = report.skipped.len(),
                                "crawled"
                            );
                        }
                        Err(e) => warn!(error = %e, "crawled document refused"),
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    .instrument(span)
    .await
}

impl From<crate::gateway::outbound::OutboundError> for super::ServiceError {
    fn from(e: crate::gateway::outbound::OutboundError) -> Self {
        GatewayError::from(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_max_age_is_honoured() {
        assert_eq!(
            max_age(Some("public, max-age=300")),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            max_age(Some("max-age=60, must-revalidate")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(max_age(Some("no-cache, max-age=60")), None);
        assert_eq!(max_age(Some("private")), None);
        assert_eq!(max_age(None), None);
    }
}
