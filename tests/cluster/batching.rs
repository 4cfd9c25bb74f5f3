//! Client writes gathered into batch entries (issue 20, point 2): under
//! concurrent load the leader puts many registrations in one log entry, and
//! each still gets its own revision, its own answer and the same signed
//! record on every node. A member that says it cannot apply batch entries
//! (`raft_encoding = "json"`, as an older binary) turns batching off.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::scenarios::SERIAL;

/// A counter or gauge from node `id`'s `/metrics` (labels, if any, ignored).
async fn metric(c: &Cluster, id: u64, name: &str) -> u64 {
    c.sample(id, name, &[])
        .await
        .unwrap_or_else(|| panic!("{name} missing from node {id}'s /metrics"))
}

/// Registers `count` agents named `{prefix}-{n}`, `clients` at a time,
/// through every node in turn; returns each acknowledged revision.
async fn register_concurrently(
    c: &Arc<Cluster>,
    prefix: &str,
    count: usize,
    clients: usize,
) -> Vec<u64> {
    let nodes = c.running();
    let mut revisions = Vec::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(clients) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|n| {
                let c = c.clone();
                let via = nodes[n % nodes.len()];
                let id = format!("{prefix}-{n}");
                tokio::spawn(async move { c.register(via, &id, "Batched write.").await })
            })
            .collect();
        for t in tasks {
            let (status, body) = t.await.expect("task");
            assert_eq!(status, 201, "{body}");
            revisions.push(body["registry"]["revision"].as_u64().expect("revision"));
        }
    }
    revisions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_entries_and_each_keeps_its_revision() {
    let _serial = SERIAL.lock().await;
    let c = Arc::new(Cluster::start(3, Options::default()).await);
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    // The identity first: established in the middle of the writes, it
    // re-signs those before it in one later entry, and a node listed
    // across that entry shows some records signed and some not.
    c.registry_info(leader).await;
    let revisions = register_concurrently(&c, "batched", 240, 48).await;
    // The leader proposed fewer entries than writes: batches formed.
    let entries = metric(&c, leader, "agentry_write_entries_total").await;
    let writes = metric(&c, leader, "agentry_batched_writes_total").await;
    assert!(writes >= 240, "{writes} writes went through the batcher");
    assert!(
        entries < writes,
        "{writes} concurrent writes took {entries} entries: none were batched"
    );
    // Every write has a revision of its own.
    let distinct: BTreeSet<u64> = revisions.iter().copied().collect();
    assert_eq!(distinct.len(), revisions.len(), "{revisions:?}");
    // And every node holds the same records, signed the same.
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let on_leader = c.contents(leader).await;
    assert_eq!(on_leader.len(), 240);
    for id in c.running() {
        assert_eq!(c.contents(id).await, on_leader, "node {id} differs");
        // Followers took the leader's signatures (signing once) rather
        // than computing every one again.
        if id != leader {
            let taken = metric(&c, id, "agentry_raft_signatures_taken_total").await;
            assert!(taken > 0, "node {id} took none of its leader's signatures");
        }
        for n in [0, 117, 239] {
            let rec = c.get(id, &format!("batched-{n}")).await;
            assert!(distinct.contains(&rec["registry"]["revision"].as_u64().unwrap_or(0)));
        }
        // Discovery on every node finds every batched agent: the index
        // follows the live change feed, which must carry each write of a
        // batch entry (it once carried none of them).
        let found = c
            .discover(
                id,
                serde_json::json!({"query": "batched write", "limit": 200, "detail": "minimal"}),
            )
            .await;
        let candidates = found["candidates"].as_array().map_or(0, Vec::len);
        assert_eq!(candidates, 200, "node {id} found {candidates}: {found}");
        let indexed = metric(&c, id, "agentry_discovery_indexed_agents").await;
        assert_eq!(indexed, 240, "node {id} indexed {indexed} of 240 agents");
    }
}

/// A node's settings to speak as an older binary would.
const AS_OLDER: &str = "raft_encoding = \"json\"\n";

/// Restarts node 3 with `toml`; the leader after.
async fn restart_third(c: &mut Cluster, toml: &str) -> u64 {
    c.configure_node(3, toml);
    c.kill(3);
    c.restart(3);
    c.wait_for_leader(Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_apply_batches_turns_batching_off() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, Options::default()).await;
    let leader = restart_third(&mut c, AS_OLDER).await;
    let c = Arc::new(c);
    // Wait until the leader has heard node 3's answer.
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    register_concurrently(&c, "warmup", 4, 1).await;
    let before = metric(&c, leader, "agentry_batched_writes_total").await;
    register_concurrently(&c, "unbatched", 96, 48).await;
    let after = metric(&c, leader, "agentry_batched_writes_total").await;
    assert_eq!(
        before, after,
        "the leader batched with a member that cannot apply batches"
    );
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let on_leader = c.contents(leader).await;
    assert_eq!(on_leader.len(), 100);
    assert_eq!(c.contents(3).await, on_leader);
}

/// Sets agent `id`'s status through node `via`.
async fn set_status(c: &Cluster, via: u64, id: &str, status: &str) {
    let resp = c
        .http
        .post(format!("{}/agents/{id}/status", c.http_url(via)))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"status": status, "reason": "replaced"}))
        .send()
        .await
        .expect("status");
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
}

/// The status each running node holds for `id`, after all applied what
/// the leader has.
async fn statuses(c: &Cluster, leader: u64, id: &str) -> Vec<Value> {
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let mut seen = Vec::new();
    for node in c.running() {
        seen.push(c.get(node, id).await["status"].clone());
    }
    seen
}

/// Registers `id`, deprecates it, and registers it again without a
/// status, all through `leader`: the status each node then holds.
async fn status_round(c: &Cluster, leader: u64, id: &str) -> Vec<Value> {
    assert_eq!(c.register(leader, id, "rules").await.0, 201);
    set_status(c, leader, id, "deprecated").await;
    assert_eq!(c.register(leader, id, "rules, again").await.0, 200);
    statuses(c, leader, id).await
}

/// Registers `id` with an `updated_at`, again without one, then once more
/// with an older one (a delayed write): the last write's status, and what
/// each node serves.
async fn floor_round(c: &Cluster, leader: u64, id: &str) -> (u16, Vec<Value>) {
    let put = |updated_at: Option<&str>| {
        let mut a = agent(id, "freshness");
        if let Some(t) = updated_at {
            a["updated_at"] = json!(t);
        }
        c.http
            .post(format!("{}/agents", c.http_url(leader)))
            .bearer_auth(ADMIN)
            .json(&a)
            .send()
    };
    for t in [Some("2026-05-08T00:00:00Z"), None] {
        assert!(put(t).await.expect("register").status().is_success());
    }
    let delayed = put(Some("2026-05-01T00:00:00Z")).await.expect("register");
    let status = delayed.status().as_u16();
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let mut served = Vec::new();
    for node in c.running() {
        served.push(c.get(node, id).await["registry"].clone());
    }
    (status, served)
}

/// A `DELETE` of `id` through `via` that holds to the revision `leader`
/// serves: its HTTP status.
async fn conditional_delete(c: &Cluster, via: u64, leader: u64, id: &str) -> u16 {
    let revision = c.get(leader, id).await["registry"]["revision"].clone();
    c.http
        .delete(format!("{}/agents/{id}", c.http_url(via)))
        .bearer_auth(ADMIN)
        .header("if-match", format!("\"{revision}\""))
        .send()
        .await
        .expect("delete")
        .status()
        .as_u16()
}

/// A change to what applying a command does (here: a re-registration that
/// leaves `status` out keeps the stored one) takes effect only once every
/// member follows it: with a member as an older binary every node applies
/// the old rule, and all agree either way. A write only newer members can
/// hold to (a deletion with `If-Match`) is refused meanwhile, whichever
/// node takes it, and works once all are upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_apply_rules_wait_for_every_member() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, Options::default()).await;
    let leader = restart_third(&mut c, AS_OLDER).await;
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let old = status_round(&c, leader, "urn:rules:mixed").await;
    assert!(old.iter().all(|s| *s == old[0]), "{old:?}");
    assert_ne!(old[0], "deprecated", "the old rule wipes it: {old:?}");
    let before = c.get(leader, "urn:rules:mixed").await;
    let follower = c.running().into_iter().find(|n| *n != leader).unwrap();
    for via in [leader, follower] {
        let status = conditional_delete(&c, via, leader, "urn:rules:mixed").await;
        assert_eq!(status, 503, "via node {via}");
    }
    let after = c.get(leader, "urn:rules:mixed").await;
    assert_eq!(after["registry"], before["registry"], "nothing changed");
    // No floor is kept or checked while a member would keep none: every
    // node stores the same record.
    let (status, served) = floor_round(&c, leader, "urn:rules:floor-mixed").await;
    assert_eq!(status, 200, "the old rules let the delayed write through");
    assert!(served.iter().all(|r| *r == served[0]), "{served:#?}");
    assert!(
        served[0].get("freshness_floor").is_none(),
        "{:#?}",
        served[0]
    );

    let leader = restart_third(&mut c, "").await;
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let new = status_round(&c, leader, "urn:rules:upgraded").await;
    assert_eq!(new, vec![Value::from("deprecated"); 3], "{new:?}");
    let follower = c.running().into_iter().find(|n| *n != leader).unwrap();
    let status = conditional_delete(&c, follower, leader, "urn:rules:upgraded").await;
    assert_eq!(status, 200);
    let (status, served) = floor_round(&c, leader, "urn:rules:floor-upgraded").await;
    assert_eq!(status, 409, "the delayed older write is stale");
    assert!(served.iter().all(|r| *r == served[0]), "{served:#?}");
    assert_eq!(
        served[0]["freshness_floor"],
        json!({"updated_at": "2026-05-08T00:00:00Z"})
    );
}

/// A node of an older release is not added to a cluster that has moved to
/// newer apply rules, as etcd refuses such a join: it would apply entries
/// by rules the others do not follow. The same node as this release joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_an_older_release_is_not_added() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, Options::default()).await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    assert_eq!(c.register(leader, "urn:join:first", "rules").await.0, 201);
    c.reserve(4);
    c.configure_node(4, AS_OLDER);
    c.spawn(4, &["--bootstrap", "manual"]);
    let raft4 = format!("127.0.0.1:{}", c.nodes[&4].raft);
    let add = |server: String| {
        let raft4 = raft4.clone();
        move || {
            crate::backup::agentry(&["cluster", "add", "4", &raft4, "--wait", "--server", &server])
        }
    };
    let (ok, out) = add(c.grpc_url(leader))();
    assert!(!ok, "{out}");
    assert!(out.contains("older release"), "{out}");
    let members = c.status(leader).await.expect("status").members;
    assert!(members.iter().all(|m| m.id != 4), "{members:?}");

    c.kill(4);
    c.configure_node(4, "");
    c.restart(4);
    let (ok, out) = add(c.grpc_url(leader))();
    assert!(ok, "{out}");
    let members = c.status(leader).await.expect("status").members;
    assert!(members.iter().any(|m| m.id == 4), "{members:?}");
}
