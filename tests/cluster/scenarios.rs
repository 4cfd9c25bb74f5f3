//! Cluster scenarios on real processes, real RocksDB and real gRPC:
//! replication, failover, restart, partitions, bootstrap by hand, snapshot
//! catch-up and membership changes under load, and watch on every node.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry::pb::{self, registry_client::RegistryClient};
use futures::StreamExt;

use crate::harness::*;

/// Clusters of three processes each: one scenario at a time keeps timing
/// realistic on a two-core machine.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LONG: Duration = Duration::from_secs(30);

fn revision(body: &serde_json::Value) -> u64 {
    body["registry"]["revision"].as_u64().unwrap_or(0)
}

/// Registers until acknowledged, trying the given nodes in turn; returns the
/// revision. Failures before the acknowledgement are retried (a leader may
/// be moving).
async fn register_acked(c: &Cluster, via: &[u64], id: &str) -> u64 {
    for attempt in 0..100 {
        let node = via[attempt % via.len()];
        let (status, body) = c.register(node, id, "acknowledged").await;
        if status == 201 || status == 200 {
            return revision(&body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{id} was never acknowledged");
}

/// Follows the change feed from revision 1 across the given nodes: when a
/// node goes away it resumes on the next one from the revision after the
/// last it saw. Stops once it has seen `until` (read when it changes).
async fn follow(
    urls: Vec<String>,
    until: tokio::sync::watch::Receiver<u64>,
    seen: Arc<Mutex<Vec<u64>>>,
) -> usize {
    let mut next = 1;
    let mut node = 0;
    let mut reconnects = 0;
    loop {
        let target = *until.borrow();
        if target != 0 && next > target {
            return reconnects;
        }
        if let Ok(mut client) = RegistryClient::connect(urls[node].clone()).await {
            let mut req = tonic::Request::new(pb::WatchRequest {
                from_revision: next,
            });
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {ADMIN}").parse().expect("header"),
            );
            if let Ok(stream) = client.watch(req).await {
                let mut stream = stream.into_inner();
                loop {
                    let target = *until.borrow();
                    if target != 0 && next > target {
                        return reconnects;
                    }
                    match tokio::time::timeout(Duration::from_millis(500), stream.next()).await {
                        Ok(Some(Ok(change))) => {
                            seen.lock().unwrap().push(change.revision);
                            next = change.revision + 1;
                        }
                        Ok(_) => break,
                        Err(_) => continue,
                    }
                }
            }
        }
        reconnects += 1;
        node = (node + 1) % urls.len();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The revisions of every change, read from one node's history.
async fn history(c: &Cluster, node: u64, until: u64) -> Vec<u64> {
    let (tx, rx) = tokio::sync::watch::channel(until);
    drop(tx);
    let seen = Arc::new(Mutex::new(Vec::new()));
    follow(vec![c.grpc_url(node)], rx, seen.clone()).await;
    let out = seen.lock().unwrap().clone();
    out
}

fn assert_in_order_once(name: &str, seen: &[u64], expected: &[u64]) {
    assert_eq!(
        seen, expected,
        "{name} must see every change once, in revision order"
    );
}

/// A client that writes through a follower reads its write back there at
/// once, with the default (local) consistency: the follower answers the
/// write only once it has applied it. Lone writes are the case that needs
/// it: the leader sends their commit on with the next entries, or after
/// up to 2 ms on its own.
#[tokio::test]
async fn a_write_through_a_follower_is_read_back_there_at_once() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, Options::default()).await;
    let leader = c.wait_for_leader(LONG).await;
    let follower = *c.running().iter().find(|&&n| n != leader).unwrap();
    for i in 0..40 {
        let id = format!("written-through-{i}");
        let (status, body) = c.register(follower, &id, "a lone write").await;
        assert_eq!(status, 201, "{body}");
        let read = c.get(follower, &id).await;
        assert_eq!(
            read["id"],
            serde_json::json!(id),
            "write {i} not read back: {read}"
        );
        // Discovery there finds it too (docs/discovery.md): it waits for
        // what the node has applied to be indexed.
        if i % 10 == 9 {
            let found = c
                .discover(
                    follower,
                    serde_json::json!({"query": "a lone write", "limit": 50, "detail": "minimal"}),
                )
                .await;
            let ids: Vec<&str> = found["candidates"]
                .as_array()
                .map(|a| a.iter().filter_map(|c| c["id"].as_str()).collect())
                .unwrap_or_default();
            assert!(
                ids.contains(&id.as_str()),
                "write {i} not discovered: {found}"
            );
        }
    }
}

#[tokio::test]
async fn replication_failover_restart_and_watch_on_every_node() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(
        3,
        Options {
            request_timeout_secs: Some(5),
            ..Default::default()
        },
    )
    .await;
    let leader = c.wait_for_leader(LONG).await;
    let follower = *c.running().iter().find(|&&n| n != leader).unwrap();

    // Two watchers: one on a follower that stays up, one starting on the
    // leader that will be killed (it must resume elsewhere).
    let (until_tx, until_rx) = tokio::sync::watch::channel(0u64);
    let on_follower = Arc::new(Mutex::new(Vec::new()));
    let on_leader = Arc::new(Mutex::new(Vec::new()));
    let w1 = tokio::spawn(follow(
        vec![c.grpc_url(follower)],
        until_rx.clone(),
        on_follower.clone(),
    ));
    let mut urls = vec![c.grpc_url(leader)];
    urls.extend(
        c.running()
            .iter()
            .filter(|&&n| n != leader)
            .map(|&n| c.grpc_url(n)),
    );
    let w2 = tokio::spawn(follow(urls, until_rx, on_leader.clone()));

    // Writes through every node (followers forward to the leader).
    let all = c.running();
    let mut acked = BTreeSet::new();
    let mut last = 0;
    for i in 0..30 {
        let id = format!("before-{i:02}");
        let (status, body) = c.register(all[i % all.len()], &id, "first").await;
        assert_eq!(status, 201, "{id}: {body}");
        last = last.max(revision(&body));
        acked.insert(id);
    }
    c.wait_revision(last, LONG).await;
    let first = c.contents(all[0]).await;
    for &n in &all {
        assert_eq!(c.contents(n).await, first, "node {n} replicated everything");
    }
    assert_eq!(first.len(), 30);
    // One identity for the cluster, and every node serves records signed
    // with it, byte for byte the same.
    let info = c.registry_info(all[0]).await;
    let identity: agentry::crypto::Identity = serde_json::from_value(info).unwrap();
    for &n in &all {
        let theirs: agentry::crypto::Identity =
            serde_json::from_value(c.registry_info(n).await).unwrap();
        assert_eq!(theirs, identity, "node {n} publishes the cluster's keys");
        let record = c.get(n, "before-07").await;
        agentry::crypto::signature::verify_with_identity(&record, &identity)
            .unwrap_or_else(|e| panic!("node {n}: {e}"));
    }

    // Kill the leader: a new one is elected, writes continue.
    c.kill(leader);
    let new_leader = c.wait_for_leader(LONG).await;
    assert_ne!(new_leader, leader);
    let alive = c.running();
    for i in 0..30 {
        let id = format!("after-{i:02}");
        last = last.max(register_acked(&c, &alive, &id).await);
        acked.insert(id);
    }

    // The old leader restarts and catches up from the log.
    c.restart(leader);
    c.wait_revision(last, LONG).await;
    let reference = c.contents(new_leader).await;
    for n in c.running() {
        let got = c.contents(n).await;
        assert_eq!(got, reference, "node {n} converged");
    }
    for id in &acked {
        assert!(reference.contains_key(id), "acknowledged {id} was lost");
    }

    // Both watchers saw every change exactly once, in order.
    until_tx.send(last).unwrap();
    let reconnects = w2.await.unwrap();
    w1.await.unwrap();
    let expected = history(&c, follower, last).await;
    assert_eq!(expected.len(), 60, "60 registrations, 60 changes");
    assert_in_order_once(
        "the follower's watcher",
        &on_follower.lock().unwrap(),
        &expected,
    );
    assert_in_order_once("the moving watcher", &on_leader.lock().unwrap(), &expected);
    assert!(reconnects >= 1, "the leader's watcher had to reconnect");
}

#[tokio::test]
async fn a_minority_cannot_commit_and_the_cluster_converges_after_healing() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(
        3,
        Options {
            request_timeout_secs: Some(2),
            ..Default::default()
        },
    )
    .await;
    let leader = c.wait_for_leader(LONG).await;
    let majority: Vec<u64> = c.running().into_iter().filter(|&n| n != leader).collect();
    for i in 0..5 {
        let (s, b) = c
            .register(majority[i % 2], &format!("early-{i}"), "x")
            .await;
        assert_eq!(s, 201, "{b}");
    }

    c.partition(&[&[leader], &majority]).await;
    // The old leader is alone: it cannot commit.
    let (status, body) = c.register(leader, "minority-write", "lost").await;
    assert!(
        status == 503 || status == 504,
        "a write on the minority side must fail, got {status}: {body}"
    );
    // Nor does it go on saying it is ready, or that it knows a leader:
    // openraft keeps it in the leader role until it hears of a newer term.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let ready = c
            .http
            .get(format!("{}/readyz", c.http_url(leader)))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        if ready == 503 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cut-off leader still answers /readyz {ready}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = c.metrics(leader).await;
    let gauge = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(gauge("agentry_raft_has_leader").as_deref(), Some("0"));
    assert_eq!(gauge("agentry_raft_is_leader").as_deref(), Some("1"));
    // The majority elects a leader among itself and keeps committing.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let l = c
            .status(majority[0])
            .await
            .map(|s| s.leader_id)
            .unwrap_or(0);
        if majority.contains(&l) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no majority leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut last = 0;
    for i in 0..10 {
        last = last.max(register_acked(&c, &majority, &format!("majority-{i}")).await);
    }
    // The minority still has not applied them.
    let isolated = c.contents(leader).await;
    assert!(!isolated.contains_key("majority-0"));

    c.heal().await;
    c.wait_for_leader(LONG).await;
    c.wait_revision(last, LONG).await;
    let reference = c.contents(majority[0]).await;
    for n in c.running() {
        assert_eq!(c.contents(n).await, reference, "node {n} converged");
    }
    assert!(
        !reference.contains_key("minority-write"),
        "an uncommitted minority write must not survive"
    );
    for i in 0..10 {
        assert!(reference.contains_key(&format!("majority-{i}")));
    }
    assert_eq!(reference.len(), 15);

    // Node 1 (the one that initialises a static cluster) loses its disk and
    // restarts with the same member list: it must see its peers' cluster and
    // not found a second one. It must not take part again either (its vote
    // would count for entries it no longer has) — not only towards the
    // leader that saw it acknowledge, but towards any leader after it.
    let mut c = c;
    let mut leader = c.wait_for_leader(LONG).await;
    if leader == 1 {
        // Let another node lead (and replicate to node 1) first.
        c.terminate(1);
        c.wait_exit(1, LONG).expect("node 1 stops");
        c.restart(1);
        leader = c.wait_for_leader(LONG).await;
    }
    // The leader founds the cluster id and records every member's data
    // directory once all of them answered it (after the partition healed).
    let cluster_id = c.wait_cluster_id(leader, LONG).await;
    let last = c.status(leader).await.unwrap().node.unwrap().last_log_index;
    c.wait_applied(last, LONG).await;
    c.kill(1);
    std::fs::remove_dir_all(c.data_dir(1)).unwrap();
    // The leader goes too: the third node can only win an election with the
    // wiped node's vote, which it must not get.
    c.kill(leader);
    let third = *[2, 3].iter().find(|&&n| n != leader).unwrap();
    c.restart(1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = c.status(third).await.unwrap();
    assert_eq!(
        s.leader_id, 0,
        "node {third} must not be elected with the wiped node's vote: {s:?}"
    );
    assert!(
        c.log(1).contains("wiped or replaced"),
        "the wiped node says why it refuses:\n{}",
        c.log(1)
    );
    assert!(
        c.log(1).contains("peers already form a cluster"),
        "node 1 saw its peers' cluster before initialising"
    );
    // The old leader comes back; whoever leads now refuses node 1 as well.
    c.restart(leader);
    let leader = c.wait_for_leader_among(&[leader, third], LONG).await;
    let (s, b) = c.register(leader, "while-refused", "x").await;
    assert_eq!(s, 201, "{b}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        c.contents(1).await.is_empty(),
        "the wiped node was not fed the log"
    );
    assert!(
        c.log(leader).contains("refused this node's Raft traffic"),
        "the leader says why node 1 is not in step:\n{}",
        c.log(leader)
    );
    // The remedy brings node 1 back, with its new data directory on record.
    let server = c.grpc_url(leader);
    cli(&["cluster", "remove", "1", "--server", &server]).await;
    let raft1 = format!("127.0.0.1:{}", c.nodes[&1].raft);
    cli(&["cluster", "add", "1", &raft1, "--wait", "--server", &server]).await;
    cli(&["cluster", "promote", "1", "--server", &server]).await;
    let last = c.status(leader).await.unwrap().node.unwrap().last_log_index;
    c.wait_applied(last, LONG).await;
    let mut reference = reference;
    reference.extend(
        c.contents(leader)
            .await
            .into_iter()
            .filter(|(id, _)| id == "while-refused"),
    );
    assert_eq!(
        c.contents(1).await,
        reference,
        "node 1 rejoined the one cluster"
    );
    assert_eq!(
        c.status(1).await.unwrap().node.unwrap().cluster_id,
        cluster_id,
        "node 1 learned the cluster's id"
    );

    // A data directory put back from an older copy keeps its incarnation
    // but lacks entries it acknowledged: the leader refuses it too.
    let leader = c.wait_for_leader(LONG).await;
    let rolled = if leader == 1 { 2 } else { 1 };
    c.kill(rolled);
    let saved = c.dir().join("saved-copy");
    copy_dir(&c.data_dir(rolled), &saved);
    c.restart(rolled);
    for i in 0..5 {
        let (s, b) = c.register(leader, &format!("after-copy-{i}"), "x").await;
        assert_eq!(s, 201, "{b}");
    }
    let last = c.status(leader).await.unwrap().node.unwrap().last_log_index;
    c.wait_applied(last, LONG).await;
    c.kill(rolled);
    std::fs::remove_dir_all(c.data_dir(rolled)).unwrap();
    std::fs::rename(&saved, c.data_dir(rolled)).unwrap();
    let term = c.status(leader).await.unwrap().node.unwrap().term;
    c.restart(rolled);
    let refused = "lost log entries it had acknowledged";
    let deadline = std::time::Instant::now() + LONG;
    while !c.log(leader).contains(refused) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        c.log(leader).contains(refused),
        "the leader refused the rolled-back node:\n{}",
        c.log(leader)
    );
    // Hearing nothing, the refused node campaigns again and again (an
    // election timeout is 0.5–1 s); neither the leader nor the cluster's
    // term may move for it. (Before, it was still sent a message now and
    // then, and the answer to one, carrying its higher term, unseated the
    // leader, seconds to tens of seconds after the refusal.)
    tokio::time::sleep(Duration::from_secs(20)).await;
    let others: Vec<u64> = c.running().into_iter().filter(|&n| n != rolled).collect();
    assert_eq!(
        c.wait_for_leader_among(&others, LONG).await,
        leader,
        "the leader stayed"
    );
    assert_eq!(
        c.status(leader).await.unwrap().node.unwrap().term,
        term,
        "the refused node's campaigns did not unseat the leader"
    );
    assert!(
        !c.contents(rolled).await.contains_key("after-copy-0"),
        "the rolled-back node was not fed the log"
    );

    // The refusal goes into the replicated cluster record, so it outlives
    // the leader that saw the loss: that leader dies (its memory with it),
    // and whichever node leads next sends the copy nothing either.
    let recorded = "recorded the refusal of members";
    let deadline = std::time::Instant::now() + LONG;
    while !c.log(leader).contains(recorded) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.log(leader).contains(recorded), "{}", c.log(leader));
    // Every node that holds the log has applied it (the copy never will).
    let last = c.status(leader).await.unwrap().node.unwrap().last_log_index;
    let deadline = std::time::Instant::now() + LONG;
    for &n in &others {
        while c
            .status(n)
            .await
            .and_then(|s| s.node)
            .map(|s| s.applied_index)
            < Some(last)
        {
            assert!(std::time::Instant::now() < deadline, "node {n} applies");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    c.kill(leader);
    c.restart(leader);
    // The two that hold the log elect one of themselves (the copy's vote is
    // neither asked for nor needed) and go on committing.
    let leader = c.wait_for_leader_among(&others, LONG).await;
    let (s, b) = c.register(leader, "after-leader-restart", "x").await;
    assert_eq!(s, 201, "{b}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let copy = c.contents(rolled).await;
    assert!(
        !copy.contains_key("after-copy-0") && !copy.contains_key("after-leader-restart"),
        "a later leader did not feed the rolled-back node the log"
    );
    let status = c.status(leader).await.unwrap();
    let marked: Vec<u64> = status
        .members
        .iter()
        .filter(|m| m.refused)
        .map(|m| m.id)
        .collect();
    assert_eq!(marked, [rolled], "{status:?}");
    assert!(
        c.log(rolled).contains("is refused by the cluster"),
        "the copy hears why its requests are refused:\n{}",
        c.log(rolled)
    );
    // The remedy drops the refusal with the member's record and brings the
    // copy back in step.
    let server = c.grpc_url(leader);
    cli(&[
        "cluster",
        "remove",
        &rolled.to_string(),
        "--server",
        &server,
    ])
    .await;
    let raft = format!("127.0.0.1:{}", c.nodes[&rolled].raft);
    cli(&[
        "cluster",
        "add",
        &rolled.to_string(),
        &raft,
        "--wait",
        "--server",
        &server,
    ])
    .await;
    cli(&[
        "cluster",
        "promote",
        &rolled.to_string(),
        "--server",
        &server,
    ])
    .await;
    let last = c.status(leader).await.unwrap().node.unwrap().last_log_index;
    c.wait_applied(last, LONG).await;
    assert_eq!(c.contents(rolled).await, c.contents(leader).await);
    let status = c.status(leader).await.unwrap();
    assert!(status.members.iter().all(|m| !m.refused), "{status:?}");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// etcd's strict reconfiguration check: a membership change after which
/// the voters that answer the leader would be no majority is refused, as is
/// promoting a learner that stopped answering; the cluster keeps taking
/// writes, and removing the member that is gone works.
#[tokio::test]
async fn membership_changes_that_would_cost_the_quorum_are_refused() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, Options::default()).await;
    let leader = c.wait_for_leader(LONG).await;
    let followers: Vec<u64> = c.running().into_iter().filter(|&n| n != leader).collect();
    let (gone, kept) = (followers[0], followers[1]);
    c.reserve(4);
    c.spawn(4, &["--bootstrap", "manual"]);
    let server = c.grpc_url(leader);
    let raft4 = format!("127.0.0.1:{}", c.nodes[&4].raft);
    cli(&["cluster", "add", "4", &raft4, "--wait", "--server", &server]).await;
    c.kill(gone);
    c.kill(4);
    // Past the 5 s in which a member counts as up.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The leader's status and metrics say which members are not answering.
    let status = c.status(kept).await.unwrap();
    let unreachable: BTreeSet<u64> = status
        .members
        .iter()
        .filter(|m| m.unreachable)
        .map(|m| m.id)
        .collect();
    assert_eq!(unreachable, BTreeSet::from([gone, 4]), "{status:?}");
    let over_http = c.get_json(leader, "/cluster").await;
    let marked: BTreeSet<u64> = over_http["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["unreachable"] == true)
        .filter_map(|m| m["id"].as_u64())
        .collect();
    assert_eq!(marked, unreachable, "{over_http}");
    assert_eq!(
        c.sample(leader, "agentry_raft_unreachable_members", &[])
            .await,
        Some(2)
    );
    let printed = cli(&["cluster", "status", "--server", &server]).await;
    assert!(
        printed.contains(&format!("node {gone} has not answered the leader for 5 s")),
        "{printed}"
    );

    // Removing the follower that is up (through it) would leave the
    // leader and the stopped node: no majority up.
    let message = conflict(
        c.http
            .delete(format!("{}/cluster/members/{kept}", c.http_url(kept))),
    )
    .await;
    assert!(
        message.contains(&format!("removing node {kept}"))
            && message.contains(&format!("[{gone}]"))
            && message.contains("have not answered"),
        "{message}"
    );
    // The stopped learner is not promoted, though it holds the log.
    let message = conflict(
        c.http
            .post(format!("{}/cluster/members/4/promote", c.http_url(leader))),
    )
    .await;
    assert!(
        message.contains("node 4 has not answered the leader"),
        "{message}"
    );
    let status = c.status(leader).await.unwrap();
    let voters: BTreeSet<u64> = status
        .members
        .iter()
        .filter(|m| m.role == "voter")
        .map(|m| m.id)
        .collect();
    assert_eq!(voters, BTreeSet::from([1, 2, 3]), "{status:?}");
    let (s, b) = c.register(kept, "still-writable", "x").await;
    assert_eq!(s, 201, "{b}");

    // Removing the stopped voter and the stopped learner works.
    cli(&["cluster", "remove", &gone.to_string(), "--server", &server]).await;
    cli(&["cluster", "remove", "4", "--server", &server]).await;
    let status = c.status(leader).await.unwrap();
    let members: BTreeSet<(u64, String)> = status
        .members
        .iter()
        .map(|m| (m.id, m.role.clone()))
        .collect();
    assert_eq!(
        members,
        BTreeSet::from([(leader, "voter".into()), (kept, "voter".into())]),
        "{status:?}"
    );
    let (s, b) = c.register(kept, "after-removal", "x").await;
    assert_eq!(s, 201, "{b}");
}

/// Sends `request` as the admin, expects 409 `conflict` and returns the
/// error's message.
async fn conflict(request: reqwest::RequestBuilder) -> String {
    let resp = request.bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "conflict", "{body}");
    body["error"]["message"].as_str().unwrap_or("").to_string()
}

/// Runs the `agentry` CLI as the admin; its output, once it succeeded.
pub(crate) async fn cli(args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(args)
        .env("AGENTRY_API_KEY", ADMIN)
        .env("AGENTRY_LOG", "warn")
        .output()
        .await
        .expect("cli runs");
    assert!(
        out.status.success(),
        "agentry {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn manual_bootstrap_snapshot_catch_up_and_membership_changes_under_writes() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::new(Options {
        snapshot_logs: Some(40),
        request_timeout_secs: Some(5),
        ..Default::default()
    });
    // Node 1 by hand: not initialised until `cluster init`.
    c.reserve(1);
    c.spawn(1, &["--bootstrap", "manual"]);
    let s = c.status(1).await.unwrap();
    assert!(!s.node.unwrap().initialized);
    let out = cli(&["cluster", "--server", &c.grpc_url(1), "init"]).await;
    assert!(out.contains("is leader"), "{out}");

    // Nodes 2 and 3 join through the CLI.
    for id in [2, 3] {
        c.reserve(id);
        c.spawn(id, &["--bootstrap", "manual"]);
        cli(&[
            "cluster",
            "--server",
            &c.grpc_url(1),
            "join",
            "--node",
            &c.grpc_url(id),
        ])
        .await;
    }
    let s = c.status(1).await.unwrap();
    assert_eq!(
        s.members.iter().filter(|m| m.role == "voter").count(),
        3,
        "{s:?}"
    );

    // Enough writes for snapshots and log purging.
    let mut acked = BTreeSet::new();
    for i in 0..150 {
        let id = format!("bulk-{i:03}");
        register_acked(&c, &[1, 2, 3], &id).await;
        acked.insert(id);
    }
    let leader = c.wait_for_leader(LONG).await;
    let ls = c.status(leader).await.unwrap().node.unwrap();
    assert!(ls.snapshots_built >= 1, "{ls:?}");
    assert!(ls.purged_index > 0, "the leader purged its log: {ls:?}");

    // Writes continue while node 4 joins and node 3 leaves.
    let stop = Arc::new(AtomicBool::new(false));
    let writer_acked = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let stop = stop.clone();
        let acked = writer_acked.clone();
        let http = c.http.clone();
        let urls = [c.http_url(1), c.http_url(2)];
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = format!("during-{i:04}");
                let resp = http
                    .post(format!("{}/agents", urls[i % 2]))
                    .bearer_auth(ADMIN)
                    .json(&agent(&id, "during"))
                    .send()
                    .await;
                if resp.is_ok_and(|r| r.status().as_u16() == 201) {
                    acked.lock().unwrap().push(id);
                }
                i += 1;
            }
        })
    };

    c.reserve(4);
    c.spawn(4, &["--bootstrap", "manual"]);
    // Asked through node 2: membership changes are forwarded to the leader.
    cli(&[
        "cluster",
        "--server",
        &c.grpc_url(2),
        "join",
        "--node",
        &c.grpc_url(4),
    ])
    .await;
    // The leader's log before index `purged` is gone, so node 4 can only
    // have caught up through a snapshot.
    let deadline = std::time::Instant::now() + LONG;
    let s4 = loop {
        let s4 = c.status(4).await.unwrap().node.unwrap();
        if s4.snapshots_installed >= 1 && s4.applied_index >= ls.purged_index {
            break s4;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 4 was not brought up by a snapshot: {s4:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(s4.snapshot_index >= ls.purged_index, "{s4:?}");

    // Remove node 3 over HTTP through node 4.
    let resp = c
        .http
        .delete(format!("{}/cluster/members/3", c.http_url(4)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    c.kill(3);

    let during = writer_acked.lock().unwrap().clone();
    assert!(!during.is_empty(), "writes went on during the changes");
    acked.extend(during);
    let leader = c.wait_for_leader(LONG).await;
    let ls = c.status(leader).await.unwrap();
    let members: BTreeSet<u64> = ls.members.iter().map(|m| m.id).collect();
    assert_eq!(members, BTreeSet::from([1, 2, 4]));
    c.wait_applied(ls.node.unwrap().last_log_index, LONG).await;
    let reference = c.contents(4).await;
    for n in [1, 2] {
        assert_eq!(c.contents(n).await, reference, "node {n} converged");
    }
    for id in &acked {
        assert!(reference.contains_key(id), "acknowledged {id} was lost");
    }

    // Adding a learner and waiting for it to catch up may take longer
    // than the request deadline (5 s here; a large snapshot takes minutes):
    // nodes 5 and 6 start only after 6 s, one added from the CLI (gRPC),
    // the other over HTTP, and both waits end in success.
    c.reserve(5);
    c.reserve(6);
    let raft5 = format!("127.0.0.1:{}", c.nodes[&5].raft);
    let server = c.grpc_url(leader);
    let by_grpc = tokio::spawn(async move {
        cli(&["cluster", "add", "5", &raft5, "--wait", "--server", &server]).await
    });
    let by_http = c
        .http
        .post(format!("{}/cluster/learners", c.http_url(leader)))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({
            "id": 6,
            "raft_addr": format!("127.0.0.1:{}", c.nodes[&6].raft),
            "wait_caught_up": true,
        }))
        .send();
    let by_http = tokio::spawn(by_http);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!by_grpc.is_finished() && !by_http.is_finished());
    // Meanwhile a learner that has received nothing is not promoted: it
    // would enlarge the quorum without adding a working voter.
    let message = conflict(
        c.http
            .post(format!("{}/cluster/members/6/promote", c.http_url(leader))),
    )
    .await;
    assert!(
        message.contains("node 6 is not in step") && message.contains("received nothing"),
        "{message}"
    );
    c.spawn(5, &["--bootstrap", "manual"]);
    c.spawn(6, &["--bootstrap", "manual"]);
    by_grpc.await.unwrap();
    let resp = by_http.await.unwrap().unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    let ls = c.status(leader).await.unwrap();
    let learners: BTreeSet<u64> = ls
        .members
        .iter()
        .filter(|m| m.role == "learner")
        .map(|m| m.id)
        .collect();
    assert_eq!(learners, BTreeSet::from([5, 6]), "{ls:?}");
    c.wait_applied(ls.node.unwrap().last_log_index, LONG).await;
    for n in [5, 6] {
        assert_eq!(c.contents(n).await, reference, "learner {n} caught up");
    }
    // Caught up, it is promoted.
    let server = c.grpc_url(leader);
    cli(&["cluster", "promote", "6", "--server", &server]).await;
    let ls = c.status(leader).await.unwrap();
    assert!(
        ls.members.iter().any(|m| m.id == 6 && m.role == "voter"),
        "{ls:?}"
    );
}
