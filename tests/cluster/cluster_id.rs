//! Clusters that share a cluster secret (or a CA) still keep apart: every
//! Raft RPC carries the cluster id, and a node of another cluster is
//! refused before its message is acted on.

use std::time::Duration;

use agentry::pb;

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
