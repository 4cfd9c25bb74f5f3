//! The replica consistency check on a real three-node cluster: every
//! member agrees after ordinary writes; a stopped member is reported as
//! unanswered; a member whose database was changed behind the log is named,
//! with the part of the state that differs; replacing it, as the docs say,
//! makes the cluster consistent again.

use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::scenarios::{cli, SERIAL};

const LONG: Duration = Duration::from_secs(60);

/// `POST /cluster/check` on node `via`, as the admin.
async fn check(c: &Cluster, via: u64) -> Value {
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap()
        .post(format!("{}/cluster/check", c.http_url(via)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

fn member(report: &Value, id: u64) -> &Value {
    report["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("node {id} in {report}"))
}

fn section<'a>(m: &'a Value, name: &str) -> &'a Value {
    m["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("section {name} in {m}"))
}

/// `agentry cluster check` through node `via`: whether it exited 0, and
/// what it printed.
async fn check_cli(c: &Cluster, via: u64) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["cluster", "check", "--server", &c.grpc_url(via)])
        .env("AGENTRY_API_KEY", ADMIN)
        .env("AGENTRY_LOG", "warn")
        .output()
        .await
        .expect("cli runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Changes one byte of agent `id`'s stored record in the stopped node's
/// database, the way a failing disk or a hand edit would: the value stays
/// valid JSON, so only a comparison with the other members can tell.
fn tamper(data_dir: &std::path::Path, id: &str) {
    let opts = rocksdb::Options::default();
    let families = rocksdb::DB::list_cf(&opts, data_dir).expect("column families");
    let db = rocksdb::DB::open_cf(&opts, data_dir, &families).expect("database opens");
    let agents = db.cf_handle("agents").expect("agents column family");
    let stored = db.get_cf(agents, id).unwrap().expect("record stored");
    let text = String::from_utf8(stored).unwrap();
    assert!(text.contains("Translates"), "{text}");
    let changed = text.replacen("Translates", "Translatez", 1);
    db.put_cf(agents, id, changed).unwrap();
    db.flush_cf(agents).unwrap();
}

#[tokio::test]
async fn a_consistency_check_names_the_member_whose_state_was_changed_behind_the_log() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(
        3,
        Options {
            extra_config: "consistency_check_secs = 5\n".into(),
            // Frequent snapshots flush what was applied, so the record the
            // test changes on disk is never written again by a replay of
            // the log at the restart.
            snapshot_logs: Some(8),
            ..Default::default()
        },
    )
    .await;
    let leader = c.wait_for_leader(LONG).await;
    for i in 0..20 {
        let id = format!("checked-{i}");
        let (status, body) = c
            .register(leader, &id, "Translates checked documents.")
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let followers: Vec<u64> = c.running().into_iter().filter(|&n| n != leader).collect();
    let (asker, victim) = (followers[0], followers[1]);

    // The leader checks by itself, every 5 s here.
    let deadline = tokio::time::Instant::now() + LONG;
    while c
        .sample(
            leader,
            "agentry_replica_checks_total",
            &["outcome=\"consistent\""],
        )
        .await
        .unwrap_or(0)
        == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no periodic check on the leader: {}",
            c.metrics(leader).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // On demand, through a follower: one digest, held by every member.
    let report = check(&c, asker).await;
    assert_eq!(report["outcome"], "consistent", "{report}");
    assert_eq!(report["members"].as_array().unwrap().len(), 3);
    let records = section(member(&report, leader), "records").clone();
    assert!(records["entries"].as_u64().unwrap() >= 20, "{report}");
    for id in [leader, asker, victim] {
        let m = member(&report, id);
        assert_eq!(m["state"], "agrees", "{report}");
        assert_eq!(section(m, "records"), &records, "{report}");
        for name in ["leases", "registry", "changes", "audit"] {
            assert_eq!(
                section(m, name),
                section(member(&report, leader), name),
                "{report}"
            );
        }
    }
    let (ok, out) = check_cli(&c, asker).await;
    assert!(ok, "{out}");
    assert!(out.contains(": consistent"), "{out}");
    // Only admins may run one, and the request takes no members.
    let anonymous = c
        .http
        .post(format!("{}/cluster/check", c.http_url(asker)))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let odd = c
        .http
        .post(format!("{}/cluster/check", c.http_url(asker)))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"members": [1]}))
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status(), 400);

    // A stopped member cannot be compared: the check says so, and is not
    // mistaken for consistent.
    c.terminate(victim);
    assert!(c.wait_exit(victim, LONG).is_some(), "node {victim} stopped");
    let report = check(&c, asker).await;
    assert_eq!(report["outcome"], "incomplete", "{report}");
    assert_eq!(member(&report, victim)["state"], "unanswered", "{report}");
    assert_eq!(member(&report, asker)["state"], "agrees", "{report}");
    let (ok, out) = check_cli(&c, asker).await;
    assert!(!ok && out.contains("not every member"), "{out}");

    // Its database changed behind the log while it was down: back in the
    // cluster it serves and follows the log as before, and the check names
    // it and the part that differs.
    tamper(&c.data_dir(victim).join("db"), "checked-3");
    c.restart(victim);
    c.wait_applied_as(leader, LONG).await;
    let report = check(&c, asker).await;
    assert_eq!(report["outcome"], "diverged", "{report}");
    let bad = member(&report, victim);
    assert_eq!(bad["state"], "differs", "{report}");
    assert_eq!(bad["differing"], serde_json::json!(["records"]), "{report}");
    assert_ne!(section(bad, "records"), &records, "{report}");
    assert_eq!(member(&report, leader)["state"], "agrees", "{report}");
    assert_eq!(member(&report, asker)["state"], "agrees", "{report}");
    let (ok, out) = check_cli(&c, asker).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("diverged") && out.contains("remove each differing member"),
        "{out}"
    );
    assert_eq!(
        c.sample(asker, "agentry_replicas_diverged", &[]).await,
        Some(1),
        "{}",
        c.metrics(asker).await
    );
    assert!(
        c.log(asker).contains("replica consistency check"),
        "the divergence is logged"
    );
    // The leader's own periodic check finds it too; the follower that
    // asked forgets its outcome once it is older than the interval, so a
    // node that does not lead never reports a stale divergence.
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let leader_says = c.sample(leader, "agentry_replicas_diverged", &[]).await;
        let asker_says = c.sample(asker, "agentry_replicas_diverged", &[]).await;
        if leader_says == Some(1) && asker_says == Some(0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "leader {leader_says:?}, asker {asker_says:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The remedy: a fresh member in its place.
    let server = c.grpc_url(leader);
    cli(&[
        "cluster",
        "remove",
        &victim.to_string(),
        "--server",
        &server,
    ])
    .await;
    c.kill(victim);
    c.reserve(4);
    c.spawn(4, &["--bootstrap", "manual"]);
    cli(&[
        "cluster",
        "join",
        "--node",
        &c.grpc_url(4),
        "--server",
        &server,
    ])
    .await;
    let report = check(&c, asker).await;
    assert_eq!(report["outcome"], "consistent", "{report}");
    assert_eq!(section(member(&report, 4), "records"), &records, "{report}");
    assert_eq!(
        c.sample(asker, "agentry_replicas_diverged", &[]).await,
        Some(0)
    );
    assert!(
        c.sample(asker, "agentry_replica_check_last_timestamp_seconds", &[])
            .await
            .unwrap_or(0)
            > 0
    );
}
