//! Prometheus text exposition of the node's state: Raft (term, leadership,
//! log, applied and snapshot indexes, per-follower match), the registry's
//! change history bounds, and the discovery index (size, revision, builds).

use std::fmt::Write;

use crate::consensus::NodeStatus;
use crate::index::IndexStats;

/// Content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn family(out: &mut String, kind: &str, name: &str, help: &str, samples: &[(String, u64)]) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

fn gauge(out: &mut String, name: &str, help: &str, samples: &[(String, u64)]) {
    family(out, "gauge", name, help, samples);
}

fn counter(out: &mut String, name: &str, help: &str, samples: &[(String, u64)]) {
    family(out, "counter", name, help, samples);
}

/// Renders the metrics page.
pub fn render(
    s: &NodeStatus,
    applied_revision: u64,
    oldest_revision: u64,
    index: &IndexStats,
) -> String {
    let node = format!("{{node_id=\"{}\"}}", s.node_id);
    let one = |v: u64| vec![(node.clone(), v)];
    let mut out = String::new();
    gauge(
        &mut out,
        "agentry_raft_term",
        "Current Raft term.",
        &one(s.term),
    );
    gauge(
        &mut out,
        "agentry_raft_is_leader",
        "1 when this node is the leader.",
        &one(u64::from(s.is_leader)),
    );
    gauge(
        &mut out,
        "agentry_raft_has_leader",
        "1 when this node knows a leader.",
        &one(u64::from(s.leader.is_some())),
    );
    gauge(
        &mut out,
        "agentry_raft_leader_id",
        "Node id of the known leader (0 when none).",
        &one(s.leader.unwrap_or(0)),
    );
    gauge(
        &mut out,
        "agentry_raft_last_log_index",
        "Index of the last entry in the log.",
        &one(s.last_log_index),
    );
    gauge(
        &mut out,
        "agentry_raft_applied_index",
        "Index of the last applied entry.",
        &one(s.applied_index),
    );
    gauge(
        &mut out,
        "agentry_raft_snapshot_index",
        "Last index included in the latest snapshot (0 when none).",
        &one(s.snapshot_index.unwrap_or(0)),
    );
    gauge(
        &mut out,
        "agentry_raft_purged_index",
        "Last purged log index (0 when none).",
        &one(s.purged_index.unwrap_or(0)),
    );
    gauge(
        &mut out,
        "agentry_raft_commit_index",
        "Highest log index known to be committed.",
        &one(s.commit_index),
    );
    gauge(
        &mut out,
        "agentry_raft_learners",
        "Number of learners in the membership.",
        &one(s.learners.len() as u64),
    );
    counter(
        &mut out,
        "agentry_raft_snapshots_built_total",
        "Snapshots this node built since it started.",
        &one(s.snapshots_built),
    );
    counter(
        &mut out,
        "agentry_raft_snapshots_installed_total",
        "Snapshots this node installed from a leader since it started.",
        &one(s.snapshots_installed),
    );
    gauge(
        &mut out,
        "agentry_raft_last_snapshot_timestamp_seconds",
        "Unix time of the last snapshot built or installed (0 when none).",
        &one(s.last_snapshot_unix.unwrap_or(0)),
    );
    gauge(
        &mut out,
        "agentry_raft_voters",
        "Number of voters in the membership.",
        &one(s.voters.len() as u64),
    );
    let followers: Vec<(String, u64)> = s
        .follower_matched
        .iter()
        .map(|(id, idx)| {
            (
                format!("{{node_id=\"{}\",follower=\"{id}\"}}", s.node_id),
                *idx,
            )
        })
        .collect();
    gauge(
        &mut out,
        "agentry_raft_follower_matched_index",
        "Leader only: highest log index known to match on each follower.",
        &followers,
    );
    let lag: Vec<(String, u64)> = s
        .follower_matched
        .iter()
        .map(|(id, idx)| {
            (
                format!("{{node_id=\"{}\",follower=\"{id}\"}}", s.node_id),
                s.last_log_index.saturating_sub(*idx),
            )
        })
        .collect();
    gauge(
        &mut out,
        "agentry_raft_follower_lag_entries",
        "Leader only: log entries each follower is behind.",
        &lag,
    );
    gauge(
        &mut out,
        "agentry_registry_applied_revision",
        "Revision of the applied registry state.",
        &one(applied_revision),
    );
    gauge(
        &mut out,
        "agentry_registry_oldest_revision",
        "Oldest revision still in the change history.",
        &one(oldest_revision),
    );
    let discovery: [(&str, &str, u64); 9] = [
        (
            "agentry_discovery_indexed_agents",
            "Agents in this node's discovery index.",
            index.agents as u64,
        ),
        (
            "agentry_discovery_indexed_revision",
            "Revision of the last change the discovery index holds.",
            index.indexed_revision,
        ),
        (
            "agentry_discovery_terms",
            "Distinct terms of the BM25 index.",
            index.terms as u64,
        ),
        (
            "agentry_discovery_postings",
            "Postings of the BM25 index.",
            index.postings as u64,
        ),
        (
            "agentry_discovery_vector_bytes",
            "Bytes held by profile and example vectors.",
            index.vector_bytes as u64,
        ),
        (
            "agentry_discovery_vector_partitions",
            "Partitions of the vector index (0: every vector is scanned).",
            index.partitions as u64,
        ),
        (
            "agentry_discovery_last_rebuild_milliseconds",
            "Duration of the last full index build from storage.",
            index.last_rebuild_ms,
        ),
        (
            "agentry_discovery_embedder_loaded",
            "1 when an embedding model is loaded (0: lexical and tags only).",
            u64::from(index.embedder_loaded),
        ),
        (
            "agentry_discovery_agents_without_vectors",
            "Agents indexed without vectors because the embedder failed on them.",
            index.without_vectors as u64,
        ),
    ];
    for (name, help, value) in discovery {
        gauge(&mut out, name, help, &one(value));
    }
    counter(
        &mut out,
        "agentry_discovery_index_rebuilds_total",
        "Full index builds from storage (at start, and when the change feed no longer reaches back).",
        &one(index.rebuilds),
    );
    counter(
        &mut out,
        "agentry_discovery_embed_failures_total",
        "Records the embedder failed on while indexing (indexed without vectors).",
        &one(index.embed_failures),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let s = NodeStatus {
            node_id: 1,
            term: 3,
            leader: Some(1),
            is_leader: true,
            last_log_index: 42,
            applied_index: 41,
            follower_matched: vec![(2, 40)],
            voters: vec![1, 2, 3],
            ..Default::default()
        };
        let index = IndexStats {
            agents: 7,
            rebuilds: 1,
            embedder_loaded: true,
            ..Default::default()
        };
        let text = render(&s, 41, 1, &index);
        assert!(text.contains("agentry_discovery_indexed_agents{node_id=\"1\"} 7\n"));
        assert!(text.contains("# TYPE agentry_discovery_index_rebuilds_total counter\n"));
        assert!(text.contains("agentry_discovery_embedder_loaded{node_id=\"1\"} 1\n"));
        assert!(
            text.contains("# TYPE agentry_raft_term gauge\nagentry_raft_term{node_id=\"1\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("agentry_raft_is_leader{node_id=\"1\"} 1\n"));
        assert!(
            text.contains("agentry_raft_follower_lag_entries{node_id=\"1\",follower=\"2\"} 2\n")
        );
        assert!(text.contains("agentry_raft_voters{node_id=\"1\"} 3\n"));
        assert!(text.contains("# TYPE agentry_raft_snapshots_built_total counter\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(
                value.parse::<u64>().is_ok(),
                "sample without a number: {line}"
            );
        }
    }
}
