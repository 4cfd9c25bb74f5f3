//! Refreshes (issue 20, point 3) across leader failover and restarts:
//! registrations and refreshes interleaved from several clients while the
//! leader is killed with SIGKILL; afterwards every refresh that was
//! acknowledged holds on every node, agents never refreshed stay expired,
//! and both survive a restart of every node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::scenarios::SERIAL;

/// An agent whose own `expires_at` has passed: only a lease shows it.
fn expired_agent(id: &str) -> Value {
    let mut a = agent(id, "Kept alive by refreshes.");
    a["expires_at"] = json!("2020-01-01T00:00:00Z");
    a
}

/// Ids node `id` lists as live (expired ones hidden), read locally.
async fn live(c: &Cluster, id: u64) -> BTreeSet<String> {
    c.contents(id).await.into_keys().collect()
}

async fn post(c: &Cluster, via: u64, path: &str, body: Value) -> (u16, Value) {
    match c
        .http
        .post(format!("{}{path}", c.http_url(via)))
        .bearer_auth(ADMIN)
        .json(&body)
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or_default())
        }
        Err(e) => (0, json!({"transport": e.to_string()})),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_refreshes_hold_on_every_node_through_failover_and_restarts() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, Options::default()).await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    let c = Arc::new(tokio::sync::RwLock::new(c));

    // Four clients, each on its own agents: register one, refresh it, and
    // refresh the earlier ones again, through any node.
    let acknowledged: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let revisions: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..4u64 {
        let (c, acknowledged, revisions, stop) = (
            c.clone(),
            acknowledged.clone(),
            revisions.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut mine: Vec<String> = Vec::new();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let c = c.read().await;
                let running = c.running();
                let via = running[(n as usize + client as usize) % running.len()];
                let id = format!("leased-{client}-{n}");
                let (status, body) = post(&c, via, "/agents", expired_agent(&id)).await;
                if status == 201 {
                    let revision = body["registry"]["revision"].as_u64().unwrap_or(0);
                    revisions.lock().unwrap().insert(id.clone(), revision);
                    mine.push(id);
                }
                // Every third agent is never refreshed.
                for id in mine.iter().filter(|id| !id.ends_with('3')) {
                    let (status, _) = post(
                        &c,
                        via,
                        &format!("/agents/{id}/refresh"),
                        json!({"ttl_seconds": 3600}),
                    )
                    .await;
                    if status == 200 {
                        acknowledged.lock().unwrap().insert(id.clone());
                    }
                }
                mine.truncate(mine.len().min(20));
                drop(c);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.write().await.kill(leader);
    let next = c
        .read()
        .await
        .wait_for_leader_among(
            &[1, 2, 3]
                .into_iter()
                .filter(|n| *n != leader)
                .collect::<Vec<_>>(),
            Duration::from_secs(20),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in clients {
        t.await.expect("client task");
    }
    let mut c = Arc::into_inner(c).expect("clients ended").into_inner();
    c.restart(leader);
    c.wait_for_leader(Duration::from_secs(20)).await;
    c.wait_applied_as(next, Duration::from_secs(30)).await;

    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 20,
        "too few refreshes were acknowledged to judge: {acknowledged:?}"
    );
    let check = |label: &'static str, per_node: Vec<BTreeSet<String>>| {
        for (i, got) in per_node.iter().enumerate() {
            let missing: Vec<_> = acknowledged.difference(got).collect();
            assert!(
                missing.is_empty(),
                "{label}: node {} lost acknowledged refreshes {missing:?}",
                i + 1
            );
            let never: Vec<_> = got.iter().filter(|id| id.ends_with('3')).collect();
            assert!(
                never.is_empty(),
                "{label}: node {} shows agents never refreshed: {never:?}",
                i + 1
            );
        }
        assert!(
            per_node.windows(2).all(|w| w[0] == w[1]),
            "{label}: nodes disagree: {per_node:?}"
        );
    };
    let mut per_node = Vec::new();
    for id in 1..=3 {
        per_node.push(live(&c, id).await);
    }
    check("after failover", per_node);
    // Refreshes rewrote no record.
    let revisions = revisions.lock().unwrap().clone();
    for id in acknowledged.iter().take(5) {
        let r = c.get(next, id).await;
        assert_eq!(
            r["registry"]["revision"].as_u64(),
            revisions.get(id).copied()
        );
    }

    // Every node restarted (SIGKILL): the holds are on disk.
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.restart(id);
    }
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    c.wait_applied_as(leader, Duration::from_secs(30)).await;
    let mut per_node = Vec::new();
    for id in 1..=3 {
        per_node.push(live(&c, id).await);
    }
    check("after restarting every node", per_node);
}
