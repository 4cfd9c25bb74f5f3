//! `/metrics`: the node's state (Raft term, leadership, log, applied and
//! snapshot indexes, per-follower match; the registry's change history
//! bounds; the discovery index) read at scrape time, next to the process's
//! request, Raft and backup instruments (`crate::metrics`), in the
//! OpenMetrics text format of the Prometheus client library.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::gate::StreamCounts;
use crate::consensus::NodeStatus;
use crate::index::IndexStats;
use crate::storage::SpaceStats;

/// Content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

/// A synced peer's state, as this node has applied it.
pub struct PeerSync {
    pub authority: String,
    /// The revision of the peer's feed read up to.
    pub cursor: u64,
    /// Live copies of the peer's records kept.
    pub copies: u64,
    /// Its `max_records` (0: none).
    pub max_records: u64,
}

/// A scrape's worth of values read from the node.
struct Page {
    registry: Registry,
    node: Labels,
}

impl Page {
    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        let g: Family<Labels, Gauge> = Family::default();
        g.get_or_create(&self.node).set(clamp(value));
        self.registry.register(name, sentence(help), g);
    }

    /// A counter the node keeps itself (name without `_total`, which the
    /// encoding adds).
    fn counter(&mut self, name: &str, help: &str, value: u64) {
        let c: Family<Labels, Counter> = Family::default();
        c.get_or_create(&self.node).inc_by(value);
        self.registry.register(name, sentence(help), c);
    }

    /// A gauge with one sample per value of `label`.
    fn labelled(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        values: impl Iterator<Item = (String, u64)>,
    ) {
        let g: Family<Labels, Gauge> = Family::default();
        for (value_of_label, value) in values {
            let mut labels = self.node.clone();
            labels.push((label, value_of_label));
            g.get_or_create(&labels).set(clamp(value));
        }
        self.registry.register(name, sentence(help), g);
    }
}

/// A help text without its final full stop, which the encoding adds.
fn sentence(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Renders the metrics page.
pub fn render(
    s: &NodeStatus,
    applied_revision: u64,
    oldest_revision: u64,
    index: &IndexStats,
    streams: StreamCounts,
    peers: &[PeerSync],
    space: SpaceStats,
) -> String {
    let mut p = Page {
        registry: Registry::default(),
        node: vec![("node_id", s.node_id.to_string())],
    };
    p.gauge("agentry_raft_term", "Current Raft term.", s.term);
    p.gauge(
        "agentry_raft_is_leader",
        "1 when this node is the leader.",
        u64::from(s.is_leader),
    );
    p.gauge(
        "agentry_raft_has_leader",
        "1 when this node knows a leader.",
        u64::from(s.leader.is_some()),
    );
    p.gauge(
        "agentry_raft_leader_id",
        "Node id of the known leader (0 when none).",
        s.leader.unwrap_or(0),
    );
    p.gauge(
        "agentry_raft_last_log_index",
        "Index of the last entry in the log.",
        s.last_log_index,
    );
    p.gauge(
        "agentry_raft_applied_index",
        "Index of the last applied entry.",
        s.applied_index,
    );
    p.gauge(
        "agentry_raft_snapshot_index",
        "Last index included in the latest snapshot (0 when none).",
        s.snapshot_index.unwrap_or(0),
    );
    p.gauge(
        "agentry_raft_purged_index",
        "Last purged log index (0 when none).",
        s.purged_index.unwrap_or(0),
    );
    p.gauge(
        "agentry_raft_commit_index",
        "Highest log index known to be committed.",
        s.commit_index,
    );
    p.gauge(
        "agentry_raft_voters",
        "Number of voters in the membership.",
        s.voters.len() as u64,
    );
    p.gauge(
        "agentry_raft_learners",
        "Number of learners in the membership.",
        s.learners.len() as u64,
    );
    p.gauge(
        "agentry_raft_refused_members",
        "Members refused for losing log entries they had acknowledged (remove and add them back).",
        s.refused.len() as u64,
    );
    p.gauge(
        "agentry_raft_unreachable_members",
        "Leader only: members that have not answered it for 5 s.",
        s.unreachable.len() as u64,
    );
    p.counter(
        "agentry_raft_snapshots_built",
        "Snapshots this node built since it started.",
        s.snapshots_built,
    );
    p.counter(
        "agentry_raft_snapshots_installed",
        "Snapshots this node installed from a leader since it started.",
        s.snapshots_installed,
    );
    p.counter(
        "agentry_raft_signatures_made",
        "Record signatures this node computed since it started.",
        s.signatures_made,
    );
    p.counter(
        "agentry_raft_signatures_taken",
        "Record signatures this node took from its leader instead of computing them (signing once), since it started.",
        s.signatures_taken,
    );
    p.gauge(
        "agentry_raft_last_snapshot_timestamp_seconds",
        "Unix time of the last snapshot built or installed (0 when none).",
        s.last_snapshot_unix.unwrap_or(0),
    );
    p.labelled(
        "agentry_raft_follower_matched_index",
        "Leader only: highest log index known to match on each follower.",
        "follower",
        s.follower_matched
            .iter()
            .map(|(id, idx)| (id.to_string(), *idx)),
    );
    p.labelled(
        "agentry_raft_follower_lag_entries",
        "Leader only: log entries each follower is behind.",
        "follower",
        s.follower_matched
            .iter()
            .map(|(id, idx)| (id.to_string(), s.last_log_index.saturating_sub(*idx))),
    );
    let of_peers =
        |value: fn(&PeerSync) -> u64| peers.iter().map(move |p| (p.authority.clone(), value(p)));
    p.labelled(
        "agentry_federation_cursor_revision",
        "The revision of each synced peer's feed this cluster has read up to (0: none yet); behind the peer's own revision while its changes are still arriving.",
        "peer",
        of_peers(|p| p.cursor),
    );
    p.labelled(
        "agentry_federation_copies",
        "Live copies of each synced peer's records kept here; new ones are refused at its max_records.",
        "peer",
        of_peers(|p| p.copies),
    );
    p.labelled(
        "agentry_federation_max_records",
        "Each synced peer's max_records (0: no limit).",
        "peer",
        of_peers(|p| p.max_records),
    );
    p.labelled(
        "agentry_open_streams",
        "Streamed answers open on this node (watches, event streams, peer feeds, backups), by caller: anonymous callers share max_anonymous_streams.",
        "caller",
        [
            ("anonymous", streams.anonymous),
            ("authenticated", streams.authenticated),
        ]
        .into_iter()
        .map(|(who, n)| (who.to_string(), n as u64)),
    );
    if let Some(free) = space.available {
        p.gauge(
            "agentry_storage_free_bytes",
            "Free bytes on the data directory's filesystem.",
            free,
        );
    }
    p.gauge(
        "agentry_storage_kept_free_bytes",
        "Free bytes below which writes are refused with 507: the reserve plus the room compacting the largest column family may take (0: the check is off).",
        space.kept_free,
    );
    p.gauge(
        "agentry_storage_compaction_headroom_bytes",
        "Room compacting the largest column family may take before it deletes its inputs.",
        space.compaction_headroom,
    );
    p.gauge(
        "agentry_registry_applied_revision",
        "Revision of the applied registry state.",
        applied_revision,
    );
    p.gauge(
        "agentry_registry_oldest_revision",
        "Oldest revision still in the change history.",
        oldest_revision,
    );
    let discovery: [(&str, &str, u64); 11] = [
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
            "agentry_discovery_last_rebuild_reused_vectors",
            "Agents whose stored vectors the last full index build reused instead of embedding them.",
            index.last_rebuild_reused,
        ),
        (
            "agentry_discovery_last_vector_training_milliseconds",
            "Duration of the last training of the vector partitions, which changes wait for before discovery shows them (0: none since start).",
            index.last_training_ms,
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
        p.gauge(name, help, value);
    }
    p.counter(
        "agentry_discovery_index_rebuilds",
        "Full index builds from storage (at start, and when the change feed no longer reaches back).",
        index.rebuilds,
    );
    p.counter(
        "agentry_discovery_vector_trainings",
        "Trainings of the vector partitions since start (each time the directory has doubled).",
        index.trainings,
    );
    p.counter(
        "agentry_discovery_embed_failures",
        "Records the embedder failed on while indexing (indexed without vectors).",
        index.embed_failures,
    );
    crate::metrics::register(&mut p.registry);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &p.registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page with a sample in every family: a leader with a follower, a
    /// synced peer, a request, a refused record, an opened and a closed
    /// connection and a snapshot observed.
    fn full_page() -> String {
        let s = NodeStatus {
            node_id: 1,
            term: 3,
            leader: Some(1),
            is_leader: true,
            last_log_index: 42,
            applied_index: 41,
            follower_matched: vec![(2, 40)],
            voters: vec![1, 2, 3],
            refused: vec![3],
            unreachable: vec![2, 3],
            ..Default::default()
        };
        let index = IndexStats {
            agents: 7,
            rebuilds: 1,
            trainings: 2,
            last_training_ms: 143,
            embedder_loaded: true,
            ..Default::default()
        };
        crate::metrics::observe_request(
            crate::metrics::RequestLabels {
                transport: "http",
                route: "GET /agents/{id}".into(),
                code: "200".into(),
            },
            std::time::Duration::from_millis(3),
        );
        let streams = StreamCounts {
            anonymous: 4,
            authenticated: 1,
        };
        let peers = [PeerSync {
            authority: "b.example".into(),
            cursor: 17,
            copies: 5,
            max_records: 100,
        }];
        let space = SpaceStats {
            available: Some(900),
            compaction_headroom: 300,
            kept_free: 364,
        };
        crate::metrics::observe_federation_refusal("b.example", "signature");
        crate::metrics::observe_connection_closed("http", "client_cap");
        crate::metrics::observe_audit_lines_dropped("write_failed", 0);
        crate::metrics::observe_snapshot("build", std::time::Duration::from_millis(4));
        drop(crate::metrics::connection_opened("http"));
        render(&s, 41, 1, &index, streams, &peers, space)
    }

    #[test]
    fn renders_prometheus_text() {
        let text = full_page();
        for sample in [
            "agentry_storage_free_bytes{node_id=\"1\"} 900\n",
            "agentry_storage_kept_free_bytes{node_id=\"1\"} 364\n",
            "agentry_storage_compaction_headroom_bytes{node_id=\"1\"} 300\n",
            "agentry_federation_cursor_revision{node_id=\"1\",peer=\"b.example\"} 17\n",
            "agentry_federation_copies{node_id=\"1\",peer=\"b.example\"} 5\n",
            "agentry_federation_max_records{node_id=\"1\",peer=\"b.example\"} 100\n",
        ] {
            assert!(text.contains(sample), "{sample}");
        }
        assert!(text.contains("agentry_open_streams{node_id=\"1\",caller=\"anonymous\"} 4\n"));
        assert!(text.contains("agentry_discovery_indexed_agents{node_id=\"1\"} 7\n"));
        assert!(text.contains("agentry_raft_refused_members{node_id=\"1\"} 1\n"));
        assert!(text.contains("agentry_raft_unreachable_members{node_id=\"1\"} 2\n"));
        // Help texts end in one full stop (the encoding adds it).
        let doubled: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# HELP") && l.ends_with(".."))
            .collect();
        assert!(doubled.is_empty(), "{doubled:#?}");
        assert!(text.contains("# TYPE agentry_discovery_index_rebuilds counter\n"));
        assert!(text.contains("agentry_discovery_index_rebuilds_total{node_id=\"1\"} 1\n"));
        assert!(text.contains("agentry_discovery_embedder_loaded{node_id=\"1\"} 1\n"));
        assert!(text.contains("agentry_discovery_vector_trainings_total{node_id=\"1\"} 2\n"));
        assert!(text
            .contains("agentry_discovery_last_vector_training_milliseconds{node_id=\"1\"} 143\n"));
        assert!(
            text.contains("# TYPE agentry_raft_term gauge\nagentry_raft_term{node_id=\"1\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("agentry_raft_is_leader{node_id=\"1\"} 1\n"));
        assert!(
            text.contains("agentry_raft_follower_lag_entries{node_id=\"1\",follower=\"2\"} 2\n")
        );
        assert!(text.contains("agentry_raft_voters{node_id=\"1\"} 3\n"));
        assert!(text.contains("# TYPE agentry_raft_snapshots_built counter\n"));
        assert!(text.contains("# TYPE agentry_request_duration_seconds histogram\n"));
        assert!(text.contains(
            "agentry_requests_total{transport=\"http\",route=\"GET /agents/{id}\",code=\"200\"}"
        ));
        assert!(text.ends_with("# EOF\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(
                value.parse::<f64>().is_ok(),
                "sample without a number: {line}"
            );
        }
    }

    /// The `agentry_*` names in `text`: runs of name characters after the
    /// prefix.
    fn names_in(text: &str) -> std::collections::BTreeSet<&str> {
        let is_name = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        text.match_indices("agentry_")
            .filter(|(at, _)| !text[..*at].ends_with(is_name))
            .map(|(at, _)| {
                let rest = &text[at..];
                &rest[..rest.find(|c: char| !is_name(c)).unwrap_or(rest.len())]
            })
            .collect()
    }

    /// The chart's alerts and dashboard name only series (or, in prose,
    /// families) a node exports: a metric renamed without them would leave
    /// an alert that can never fire and a panel that stays empty.
    #[test]
    fn the_charts_alerts_and_dashboard_name_exported_metrics() {
        let text = full_page();
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter_map(|l| match l.strip_prefix("# TYPE ") {
                Some(family) => family.split(' ').next(),
                None if l.starts_with('#') => None,
                None => l.split(['{', ' ']).next(),
            })
            .collect();
        for (file, body) in [
            (
                "helm/agentry/alerts/agentry.rules.yaml",
                include_str!("../../../helm/agentry/alerts/agentry.rules.yaml"),
            ),
            (
                "helm/agentry/dashboards/agentry.json",
                include_str!("../../../helm/agentry/dashboards/agentry.json"),
            ),
        ] {
            let named = names_in(body);
            assert!(named.len() >= 10, "{file} names {named:?}");
            let unknown: Vec<&&str> = named.iter().filter(|n| !exported.contains(*n)).collect();
            assert!(
                unknown.is_empty(),
                "{file} names series no node exports: {unknown:?}"
            );
        }
        // The check itself tells a renamed series from an exported one.
        assert!(exported.contains("agentry_raft_commit_duration_seconds_bucket"));
        assert!(!exported.contains("agentry_raft_commit_duration_bucket"));
    }
}
