//! The demo directory (`agentry serve --demo`): the 199 MetaTool agents,
//! compiled into the binary, registered on start so a newcomer's first
//! discovery request has something sensible to find.

use tracing::{info, warn};

use crate::convert::dataset_agent_json;
use crate::domain::{AgentMetadata, Principal, Role};
use crate::service::RegistryService;

/// The demo agents, one JSON object per line (also the benchmark corpus source).
pub const AGENTS: &str = include_str!("../demo/metatool/agents.jsonl");

/// Registers every demo agent that is not stored yet, as principal `demo`.
pub async fn load(service: RegistryService) {
    let demo = Principal::new("demo", Role::Publisher);
    let (mut added, mut present) = (0usize, 0usize);
    for (i, line) in AGENTS.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let parsed = serde_json::from_str(line)
            .map_err(|e| e.to_string())
            .and_then(|v| dataset_agent_json(v).map_err(|e| e.to_string()))
            .and_then(|v| serde_json::from_value::<AgentMetadata>(v).map_err(|e| e.to_string()));
        let meta = match parsed {
            Ok(m) => m,
            Err(e) => {
                warn!(line = i + 1, error = %e, "skipping a demo agent");
                continue;
            }
        };
        if matches!(service.reader().get(&meta.id), Ok(Some(r)) if !r.envelope.deleted) {
            present += 1;
            continue;
        }
        match service.register(Some(&demo), meta, None).await {
            Ok(_) => added += 1,
            Err(e) => warn!(line = i + 1, error = %e, "a demo agent was not registered"),
        }
    }
    info!(added, already_present = present, "demo directory loaded");
}
