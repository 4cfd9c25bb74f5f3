//! The process's instruments: request counts and latencies on both
//! transports, Raft commit, apply and log-sync latencies, snapshot and
//! backup durations, records refused from peers' feeds. They are
//! process-wide (one node per process in production), so storage,
//! consensus and the API record into them without a handle passed through
//! every layer; `/metrics` renders them next to the node's state
//! (`api::http::metrics`).

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The `route` of a request answered before it reached one: a malformed
/// head, a path no route takes, a method its path does not take, or an
/// unknown gRPC method. One value whatever was asked, so a client cannot
/// mint label values, and a probe of the listeners still shows.
pub const UNROUTED: &str = "(unrouted)";

/// Counts a request answered with `code` before it reached a route.
pub fn observe_unrouted(transport: &'static str, code: String, took: Duration) {
    observe_request(
        RequestLabels {
            transport,
            route: UNROUTED.into(),
            code,
        },
        took,
    );
}

/// One request's route and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `http` or `grpc`.
    pub transport: &'static str,
    /// The route template (`GET /agents/{id}`) or the gRPC method
    /// (`agentry.v1.Registry/Get`); never a raw path, so ids do not become
    /// label values.
    pub route: String,
    /// HTTP status, or the gRPC status code name (`OK`, `NOT_FOUND`, ...).
    pub code: String,
}

/// What a Raft storage operation did.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SnapshotLabels {
    /// `build` or `install`.
    pub action: &'static str,
}

/// A peer's record refused by the federation sync, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The peer's authority (configured peers only, so few values).
    pub peer: String,
    /// `signature`, `malformed`, `private`, `too_large`, `policy`,
    /// `quota`, ...
    pub reason: &'static str,
}

/// Lines of the audit file lost, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditDropLabels {
    /// `write_failed` or `behind`.
    pub reason: &'static str,
}

/// One of the node's listeners (`http`, `grpc`, `peer`, `raft`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

/// A connection the node closed on a listener, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    pub listener: &'static str,
    /// `connection_cap`, `client_cap`, `header_timeout`, `tls_handshake`,
    /// `idle`, `write_timeout`.
    pub reason: &'static str,
}

/// How a replica consistency check came out.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    /// `consistent`, `diverged` or `incomplete`.
    pub outcome: &'static str,
}

struct Instruments {
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    commit_seconds: Histogram,
    apply_seconds: Histogram,
    log_sync_seconds: Histogram,
    log_append_seconds: Histogram,
    log_appended: Counter,
    replicate_seconds: Histogram,
    replicated: Counter,
    append_handling_seconds: Histogram,
    applied: Counter,
    refresh_entries: Counter,
    refreshes: Counter,
    write_entries: Counter,
    batched_writes: Counter,
    snapshot_seconds: Family<SnapshotLabels, Histogram, fn() -> Histogram>,
    backup_seconds: Histogram,
    backup_bytes: Counter,
    federation_refused: Family<RefusalLabels, Counter>,
    audit_lines_dropped: Family<AuditDropLabels, Counter>,
    open_connections: Family<ListenerLabels, Gauge>,
    connections_closed: Family<ClosedLabels, Counter>,
    replica_checks: Family<CheckLabels, Counter>,
    replica_check_seconds: Histogram,
    replicas_diverged: Gauge,
    /// Unix seconds of the last check this node ran; 0: none.
    replica_check_at: Gauge,
}

/// 0.25 ms to about 8 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// 10 ms to about 10 min, doubling: snapshots and backups of large
/// directories.
fn long() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

fn instruments() -> &'static Instruments {
    static I: OnceLock<Instruments> = OnceLock::new();
    I.get_or_init(|| Instruments {
        requests: Family::default(),
        request_seconds: Family::new_with_constructor(latency),
        commit_seconds: latency(),
        apply_seconds: latency(),
        log_sync_seconds: latency(),
        log_append_seconds: latency(),
        log_appended: Counter::default(),
        replicate_seconds: latency(),
        replicated: Counter::default(),
        append_handling_seconds: latency(),
        applied: Counter::default(),
        refresh_entries: Counter::default(),
        refreshes: Counter::default(),
        write_entries: Counter::default(),
        batched_writes: Counter::default(),
        snapshot_seconds: Family::new_with_constructor(long),
        backup_seconds: long(),
        backup_bytes: Counter::default(),
        federation_refused: Family::default(),
        audit_lines_dropped: Family::default(),
        open_connections: Family::default(),
        connections_closed: Family::default(),
        replica_checks: Family::default(),
        replica_check_seconds: long(),
        replicas_diverged: Gauge::default(),
        replica_check_at: Gauge::default(),
    })
}

/// Counts one answered request and its latency.
pub fn observe_request(labels: RequestLabels, took: Duration) {
    let i = instruments();
    i.request_seconds
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
    i.requests.get_or_create(&labels).inc();
}

/// A write's time from proposal to applied on the leader.
pub fn observe_commit(took: Duration) {
    instruments().commit_seconds.observe(took.as_secs_f64());
}

/// The state machine's time to apply one batch of `entries` committed
/// entries.
pub fn observe_apply(took: Duration, entries: u64) {
    let i = instruments();
    i.apply_seconds.observe(took.as_secs_f64());
    i.applied.inc_by(entries);
}

/// One WAL sync of the Raft log (it may cover many appends).
pub fn observe_log_sync(took: Duration) {
    instruments().log_sync_seconds.observe(took.as_secs_f64());
}

/// One append of `entries` entries to the Raft log (the write, before the
/// sync that makes it durable).
pub fn observe_log_append(took: Duration, entries: u64) {
    let i = instruments();
    i.log_append_seconds.observe(took.as_secs_f64());
    i.log_appended.inc_by(entries);
}

/// One log entry proposed by this node carrying `refreshes` refreshes.
pub fn observe_refresh_batch(refreshes: usize) {
    let i = instruments();
    i.refresh_entries.inc();
    i.refreshes.inc_by(refreshes as u64);
}

/// Leader: one log entry proposed for `writes` client writes gathered by
/// the write batcher.
pub fn observe_write_batch(writes: usize) {
    let i = instruments();
    i.write_entries.inc();
    i.batched_writes.inc_by(writes as u64);
}

/// Leader: one AppendEntries round trip to a follower carrying `entries`
/// entries (the follower's append and sync included).
pub fn observe_replicate(took: Duration, entries: u64) {
    let i = instruments();
    i.replicate_seconds.observe(took.as_secs_f64());
    i.replicated.inc_by(entries);
}

/// Follower: one AppendEntries that carried entries, from its arrival at
/// the handler to its answer. Beside the leader's round trip it splits
/// that round trip into what the follower spends and what the transport
/// and the leader's own wake-ups spend.
pub fn observe_append_handling(took: Duration) {
    instruments()
        .append_handling_seconds
        .observe(took.as_secs_f64());
}

/// A Raft snapshot built or installed.
pub fn observe_snapshot(action: &'static str, took: Duration) {
    instruments()
        .snapshot_seconds
        .get_or_create(&SnapshotLabels { action })
        .observe(took.as_secs_f64());
}

/// A backup written (`agentry snapshot save`).
pub fn observe_backup(took: Duration, bytes: u64) {
    let i = instruments();
    i.backup_seconds.observe(took.as_secs_f64());
    i.backup_bytes.inc_by(bytes);
}

/// A record of `peer`'s feed the sync did not keep.
pub fn observe_federation_refusal(peer: &str, reason: &'static str) {
    instruments()
        .federation_refused
        .get_or_create(&RefusalLabels {
            peer: peer.to_string(),
            reason,
        })
        .inc();
}

/// Counts `lines` of the audit file lost for `reason`.
pub fn observe_audit_lines_dropped(reason: &'static str, lines: u64) {
    instruments()
        .audit_lines_dropped
        .get_or_create(&AuditDropLabels { reason })
        .inc_by(lines);
}

/// Counts a connection the node closed on `listener` for `reason`.
pub fn observe_connection_closed(listener: &'static str, reason: &'static str) {
    instruments()
        .connections_closed
        .get_or_create(&ClosedLabels { listener, reason })
        .inc();
}

/// A replica consistency check this node ran: its outcome, the members
/// whose state differed, and how long the whole check took.
pub fn observe_replica_check(outcome: &'static str, diverged: i64, took: Duration) {
    let i = instruments();
    i.replica_checks
        .get_or_create(&CheckLabels { outcome })
        .inc();
    i.replica_check_seconds.observe(took.as_secs_f64());
    i.replicas_diverged.set(diverged);
    i.replica_check_at
        .set(time::OffsetDateTime::now_utc().unix_timestamp());
}

/// Sets `agentry_replicas_diverged` back to 0 once the last check this
/// node ran is older than `after` (`service::consistency`).
pub fn expire_replica_check(after: Duration) {
    let i = instruments();
    let at = i.replica_check_at.get();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if at > 0 && now.saturating_sub(at) >= i64::try_from(after.as_secs()).unwrap_or(i64::MAX) {
        i.replicas_diverged.set(0);
    }
}

/// Counts a connection accepted on `listener` as open until the returned
/// guard is dropped with it.
pub fn connection_opened(listener: &'static str) -> OpenConnection {
    let gauge = instruments()
        .open_connections
        .get_or_create(&ListenerLabels { listener })
        .clone();
    gauge.inc();
    OpenConnection(gauge)
}

/// An open connection in `agentry_open_connections`.
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Registers the instruments (shared, not copied) in `registry`. Help
/// texts have no final full stop: the encoding adds one.
pub fn register(registry: &mut Registry) {
    let i = instruments();
    registry.register(
        "agentry_requests",
        "Requests answered, by transport, route or gRPC method, and status code",
        i.requests.clone(),
    );
    registry.register(
        "agentry_request_duration_seconds",
        "Time to answer a request (to the response headers; a stream's life is not included)",
        i.request_seconds.clone(),
    );
    registry.register(
        "agentry_raft_commit_duration_seconds",
        "Leader: a write's time from proposal until it is committed and applied",
        i.commit_seconds.clone(),
    );
    registry.register(
        "agentry_raft_apply_duration_seconds",
        "Time to apply one batch of committed entries to the state machine",
        i.apply_seconds.clone(),
    );
    registry.register(
        "agentry_raft_log_sync_duration_seconds",
        "Time of one WAL sync of the Raft log (one sync covers every append queued meanwhile)",
        i.log_sync_seconds.clone(),
    );
    registry.register(
        "agentry_raft_log_append_duration_seconds",
        "Time of one append to the Raft log, before the sync that makes it durable",
        i.log_append_seconds.clone(),
    );
    registry.register(
        "agentry_raft_log_appended_entries",
        "Entries appended to this node's Raft log",
        i.log_appended.clone(),
    );
    registry.register(
        "agentry_refresh_entries",
        "Log entries of batched refreshes this node proposed",
        i.refresh_entries.clone(),
    );
    registry.register(
        "agentry_refreshes",
        "Refreshes this node proposed (divided by agentry_refresh_entries_total: refreshes per entry)",
        i.refreshes.clone(),
    );
    registry.register(
        "agentry_write_entries",
        "Leader: log entries proposed for client writes by the write batcher",
        i.write_entries.clone(),
    );
    registry.register(
        "agentry_batched_writes",
        "Leader: client writes in those entries (divided by agentry_write_entries_total: writes per entry)",
        i.batched_writes.clone(),
    );
    registry.register(
        "agentry_raft_replicate_duration_seconds",
        "Leader: one AppendEntries round trip that carried entries, the follower's append and sync included",
        i.replicate_seconds.clone(),
    );
    registry.register(
        "agentry_raft_replicated_entries",
        "Leader: entries sent to followers in AppendEntries",
        i.replicated.clone(),
    );
    registry.register(
        "agentry_raft_append_handling_duration_seconds",
        "Follower: one AppendEntries that carried entries, from its arrival to its answer (append and sync included)",
        i.append_handling_seconds.clone(),
    );
    registry.register(
        "agentry_raft_applied_entries",
        "Entries applied to this node's state machine",
        i.applied.clone(),
    );
    registry.register(
        "agentry_raft_snapshot_duration_seconds",
        "Time to build a Raft snapshot, or to install one from the leader",
        i.snapshot_seconds.clone(),
    );
    registry.register(
        "agentry_backup_duration_seconds",
        "Time to write a backup (agentry snapshot save) from this node",
        i.backup_seconds.clone(),
    );
    registry.register(
        "agentry_backup_bytes",
        "Bytes of backups written from this node",
        i.backup_bytes.clone(),
    );
    registry.register(
        "agentry_federation_refused_records",
        "Leader: records of a peer's feed not kept here, by peer and reason (a bad signature, the trust policy, the peer's record limit, ...)",
        i.federation_refused.clone(),
    );
    registry.register(
        "agentry_audit_file_dropped_lines",
        "Lines of the audit trail's JSON-lines file lost (the database keeps the entries), by reason: write_failed (the file could not be written) or behind (the writer was too far behind)",
        i.audit_lines_dropped.clone(),
    );
    registry.register(
        "agentry_open_connections",
        "Connections open on each listener of this node (each listener closes new ones beyond [connections] max_connections)",
        i.open_connections.clone(),
    );
    registry.register(
        "agentry_connections_closed",
        "Connections this node closed, by listener and reason (a connection or client cap, a header or TLS deadline, idle, a client that stopped reading)",
        i.connections_closed.clone(),
    );
    registry.register(
        "agentry_replica_checks",
        "Replica consistency checks this node ran (on demand, or periodically as leader), by outcome: consistent, diverged (a member's state differs from the others') or incomplete (a member did not answer)",
        i.replica_checks.clone(),
    );
    registry.register(
        "agentry_replica_check_duration_seconds",
        "Time of a replica consistency check, from proposing its entry until every member's digest was compared",
        i.replica_check_seconds.clone(),
    );
    registry.register(
        "agentry_replicas_diverged",
        "Members whose replicated state differed from the others' in the last consistency check this node ran (0 until one ran; a node that does not lead sets it back to 0 once that check is older than consistency_check_secs)",
        i.replicas_diverged.clone(),
    );
    registry.register(
        "agentry_replica_check_last_timestamp_seconds",
        "Unix time of the last replica consistency check this node ran (0: none since it started)",
        i.replica_check_at.clone(),
    );
}
