//! Clusters that share a cluster secret (or a CA) still keep apart: every
//! Raft RPC carries the cluster id, and a node of another cluster is
//! refused before its message is acted on.

use std::time::Duration;

use agentry::pb;

use crate::backup::{agentry, restore, save};
use crate::harness::*;
use crate::scenarios::SERIAL;

const LONG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_node_of_another_cluster_is_refused_even_with_the_same_secret() {
    let _serial = SERIAL.lock().await;
    // A three-node cluster and a single-node one, made with the same
    // secret; A's leader is stopped first, so A leads in a higher term than
    // B: without the check, B's node would take A's leader for its own and
    // give up its log for A's.
    let mut a = Cluster::start(3, Options::default()).await;
    let mut b = Cluster::new(Options::default());
    b.reserve(4);
    let members = b.member_list();
    b.spawn(4, &["--initial-members", &members]);
    b.wait_for_leader(LONG).await;
    let (s, body) = b.register(4, "only-in-b", "x").await;
    assert_eq!(s, 201, "{body}");
    let first = a.wait_for_leader(LONG).await;
    a.kill(first);
    let leader = a.wait_for_leader(LONG).await;
    let (s, body) = a.register(leader, "only-in-a", "x").await;
    assert_eq!(s, 201, "{body}");
    let id_a = a.wait_cluster_id(leader, LONG).await;
    let id_b = b.wait_cluster_id(4, LONG).await;
    assert_ne!(id_a, id_b, "each cluster founded its own id");
    let term_a = a.status(leader).await.unwrap().node.unwrap().term;
    let term_b = b.status(4).await.unwrap().node.unwrap().term;
    assert!(term_a > term_b, "A's term {term_a} is above B's {term_b}");

    // An operator adds B's node to A by mistake.
    let raft_b = format!("127.0.0.1:{}", b.nodes[&4].raft);
    a.admin(leader)
        .await
        .add_learner(Cluster::request(pb::AddLearnerRequest {
            id: 4,
            raft_addr: raft_b,
            wait_caught_up: false,
        }))
        .await
        .expect("A's membership takes the learner");
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert!(
        b.log(4).contains("refused Raft traffic") && b.log(4).contains(&id_a),
        "B's node says whose traffic it refused:\n{}",
        b.log(4)
    );
    assert!(
        a.log(leader).contains("refused this node's Raft traffic"),
        "A's leader says why its learner is not in step:\n{}",
        a.log(leader)
    );
    let node_b = b.status(4).await.unwrap();
    assert_eq!(node_b.leader_id, 4, "B still leads itself");
    let n = node_b.node.unwrap();
    assert_eq!((n.term, n.cluster_id.as_str()), (term_b, id_b.as_str()));
    assert_eq!(
        b.contents(4).await.into_keys().collect::<Vec<_>>(),
        ["only-in-b"],
        "B's registry is untouched"
    );
    let learner = a
        .status(leader)
        .await
        .unwrap()
        .members
        .into_iter()
        .find(|m| m.id == 4)
        .expect("A lists its learner");
    assert_eq!(learner.matched_index, 0, "A replicated nothing to B");
    let (s, body) = b.register(4, "still-b", "x").await;
    assert_eq!(s, 201, "B keeps serving: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restored_cluster_and_its_origin_refuse_each_other_from_the_first_message() {
    let _serial = SERIAL.lock().await;
    let mut old = Cluster::start(3, Options::default()).await;
    let leader = old.wait_for_leader(LONG).await;
    let (s, body) = old.register(leader, "in-backup", "x").await;
    assert_eq!(s, 201, "{body}");
    let old_id = old.wait_cluster_id(3, LONG).await;
    let file = old.dir().join("registry.backup");
    let (ok, out) = save(&file, &old.grpc_url(leader));
    assert!(ok, "{out}");
    let (s, body) = old.register(leader, "after-backup", "x").await;
    assert_eq!(s, 201, "{body}");
    old.wait_applied_as(leader, LONG).await;

    // Without the id from the start, the restored leader would have the
    // old node give up its log for the new one.
    let (mut new, members) = beside_a_lone_old_node(&mut old);
    let mut printed = Vec::new();
    for id in 1..=2 {
        let (ok, out) = restore(&file, &new.data_dir(id), id, &members);
        assert!(ok, "{out}");
        let id = out
            .split("cluster id ")
            .nth(1)
            .and_then(|s| s.split(',').next());
        printed.push(id.expect("restore prints the cluster id").to_string());
    }
    assert_eq!(printed[0], printed[1], "both restored nodes got one id");
    new.spawn(1, &["--initial-members", &members]);
    // Before any election, and with no peer answering yet.
    let new_id = new.wait_cluster_id(1, Duration::from_secs(10)).await;
    assert_eq!(new_id, printed[0]);
    assert_ne!(new_id, old_id);
    new.spawn(2, &["--initial-members", &members]);
    let new_leader = new.wait_for_leader(LONG).await;
    let (s, body) = new.register(new_leader, "after-restore", "x").await;
    assert_eq!(s, 201, "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        old.log(3).contains("refused Raft traffic") && old.log(3).contains(&new_id),
        "the old node refused the restored cluster:\n{}",
        old.log(3)
    );

    // The old cluster lost nothing; the restored one holds the backup and
    // its own write only.
    whole_again_with(&mut old, &["after-backup", "in-backup"]).await;
    let ids: Vec<String> = new.contents(new_leader).await.into_keys().collect();
    assert_eq!(ids, ["after-restore", "in-backup"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_cluster_initialised_onto_another_clusters_node_cannot_replace_its_log() {
    let _serial = SERIAL.lock().await;
    let mut old = Cluster::start(3, Options::default()).await;
    let leader = old.wait_for_leader(LONG).await;
    let (s, body) = old.register(leader, "in-old", "x").await;
    assert_eq!(s, 201, "{body}");
    old.wait_cluster_id(3, LONG).await;
    old.wait_applied_as(leader, LONG).await;

    // `cluster init` founds without asking the peers first, and the new
    // cluster has no id yet: only the old node's check of who may touch
    // its log stands between the new leader's entries and its own.
    let (mut new, members) = beside_a_lone_old_node(&mut old);
    for id in 1..=2 {
        new.spawn(id, &["--bootstrap", "manual"]);
    }
    let (ok, out) = agentry(&[
        "cluster",
        "init",
        "--member",
        &members,
        "--server",
        &new.grpc_url(1),
    ]);
    assert!(ok, "{out}");
    let new_leader = new.wait_for_leader(LONG).await;
    let (s, body) = new.register(new_leader, "in-new", "x").await;
    assert_eq!(s, 201, "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        old.log(3).contains("claims no cluster"),
        "the old node refused the new cluster:\n{}",
        old.log(3)
    );
    assert!(
        new.log(new_leader)
            .contains("refused this node's Raft traffic"),
        "the new leader says why node 3 does not follow:\n{}",
        new.log(new_leader)
    );

    whole_again_with(&mut old, &["in-old"]).await;
}

/// Stops `old`'s nodes 1 and 2 and reserves a new cluster's nodes 1 and 2;
/// returns it and a member list that names, as its node 3, the address
/// where `old`'s node 3 still runs, alone: no leader of its own holds it,
/// and its term and the new cluster's outbid each other as they meet.
fn beside_a_lone_old_node(old: &mut Cluster) -> (Cluster, String) {
    old.kill(1);
    old.kill(2);
    let mut new = Cluster::new(Options::default());
    new.reserve(1);
    new.reserve(2);
    let members = format!("{},3=127.0.0.1:{}", new.member_list(), old.nodes[&3].raft);
    (new, members)
}

/// Starts `old`'s nodes 1 and 2 again: the cluster, whole, takes a write,
/// and every node holds `held` and that write, nothing lost, nothing of
/// another cluster's.
async fn whole_again_with(old: &mut Cluster, held: &[&str]) {
    old.restart(1);
    old.restart(2);
    let leader = old.wait_for_leader(LONG).await;
    let (s, body) = old.register(leader, "whole-again", "x").await;
    assert_eq!(s, 201, "{body}");
    old.wait_applied_as(leader, LONG).await;
    let mut want: Vec<&str> = held.iter().copied().chain(["whole-again"]).collect();
    want.sort_unstable();
    for id in 1..=3 {
        let ids: Vec<String> = old.contents(id).await.into_keys().collect();
        assert_eq!(ids, want, "old node {id}");
    }
}
