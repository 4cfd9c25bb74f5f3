//! `agentry snapshot save` under write load from a follower of a real
//! three-node cluster, and `agentry snapshot restore` into a new three-node
//! cluster that serves every record of the backup with signatures that
//! still verify against the original registry's keys.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agentry::crypto::signature::verify_with_identity;
use agentry::crypto::Identity;
use serde_json::Value;

use crate::harness::*;
use crate::scenarios::SERIAL;

pub(crate) fn agentry(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(args)
        .env("AGENTRY_API_KEY", ADMIN)
        .env("AGENTRY_LOG", "warn")
        .output()
        .expect("agentry runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `agentry snapshot save FILE --server URL`: an online backup.
pub(crate) fn save(file: &Path, server: &str) -> (bool, String) {
    agentry(&[
        "snapshot",
        "save",
        file.to_str().unwrap(),
        "--server",
        server,
    ])
}

pub(crate) fn restore(file: &Path, dir: &Path, id: u64, members: &str) -> (bool, String) {
    agentry(&[
        "snapshot",
        "restore",
        file.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--node-id",
        &id.to_string(),
        "--initial-members",
        members,
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_taken_under_load_restores_into_a_new_cluster() {
    let _serial = SERIAL.lock().await;
    let old = Cluster::start(3, Options::default()).await;
    let info = old.registry_info(1).await;
    let identity: Identity = serde_json::from_value(info.clone()).expect("identity");
    for i in 0..120 {
        let (status, body) = old
            .register(1 + i % 3, &format!("kept-{i}"), "Answers questions.")
            .await;
        assert_eq!(status, 201, "{body}");
    }
    for i in 0..5 {
        let gone = old
            .http
            .delete(format!("{}/agents/kept-{i}", old.http_url(1)))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("delete");
        assert!(gone.status().is_success(), "{}", gone.status());
    }
    let leader = old.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // Writes keep coming while the backup is taken from a follower.
    let load = {
        let url = old.http_url(leader);
        let http = old.http.clone();
        tokio::spawn(async move {
            let mut acked = 0;
            for i in 0..150 {
                let r = http
                    .post(format!("{url}/agents"))
                    .bearer_auth(ADMIN)
                    .json(&agent(&format!("during-{i}"), "Written during the backup."))
                    .send()
                    .await
                    .expect("answered");
                if r.status() == 201 {
                    acked += 1;
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let file = old.dir().join("registry.backup");
    let (ok, out) = save(&file, &old.grpc_url(follower));
    assert!(ok, "{out}");
    assert!(out.contains("records"), "{out}");
    assert_eq!(load.await.unwrap(), 150, "every write during the backup");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the backup holds signing keys: {mode:o}");
    }
    let (ok, status) = agentry(&["snapshot", "status", file.to_str().unwrap(), "--json"]);
    assert!(ok, "{status}");
    let status: Value = serde_json::from_str(status.trim()).expect("status json");
    assert_eq!(status["identity"], true);
    // Everything registered before the save began is in it, and whatever
    // else the backup holds is a consistent prefix of the writes during it.
    let text = std::fs::read_to_string(&file).unwrap();
    for i in 0..120 {
        assert!(text.contains(&format!("\"kept-{i}\"")), "kept-{i} missing");
    }
    let during: Vec<usize> = (0..150)
        .filter(|i| text.contains(&format!("\"id\":\"during-{i}\"")))
        .collect();
    assert_eq!(during, (0..during.len()).collect::<Vec<_>>());
    let expected: std::collections::BTreeMap<String, String> = old
        .contents(follower)
        .await
        .into_iter()
        .filter(|(id, _)| {
            !id.starts_with("during-")
                || during.contains(&id.trim_start_matches("during-").parse().unwrap())
        })
        .collect();
    assert_eq!(expected.len(), 115 + during.len());

    // Offline, from a stopped node's data directory (losing quorum): the
    // same records; refused while the node still runs.
    let offline = old.dir().join("offline.backup");
    let data3 = old.data_dir(3);
    let save_offline = || {
        agentry(&[
            "snapshot",
            "save",
            offline.to_str().unwrap(),
            "--data-dir",
            data3.to_str().unwrap(),
        ])
    };
    let (ok, out) = save_offline();
    assert!(!ok && out.contains("still running"), "{out}");
    let mut old = old;
    old.terminate(3);
    old.wait_exit(3, Duration::from_secs(20))
        .expect("node 3 stops");
    let (ok, out) = save_offline();
    assert!(ok, "{out}");
    let (ok, out) = agentry(&["snapshot", "status", offline.to_str().unwrap(), "--json"]);
    assert!(ok, "{out}");
    let offline_status: Value = serde_json::from_str(out.trim()).expect("status json");
    assert!(offline_status["records"].as_u64().unwrap() >= 120 + during.len() as u64);

    // Damaged and misdirected restores are refused and write nothing.
    let mut new = Cluster::new(Options::default());
    for id in 1..=3 {
        new.reserve(id);
    }
    let members = new.member_list();
    let damaged = old.dir().join("damaged.backup");
    std::fs::write(&damaged, text.replacen("kept-7", "kept-8", 1)).unwrap();
    let (ok, out) = restore(&damaged, &new.data_dir(1), 1, &members);
    assert!(!ok && out.contains("checksum"), "{out}");
    assert!(!new.data_dir(1).exists());
    let cut = old.dir().join("cut.backup");
    std::fs::write(&cut, &text[..text.len() / 2]).unwrap();
    let (ok, out) = restore(&cut, &new.data_dir(1), 1, &members);
    assert!(!ok && out.contains("incomplete"), "{out}");
    std::fs::create_dir_all(new.data_dir(1)).unwrap();
    std::fs::write(new.data_dir(1).join("something"), "x").unwrap();
    let (ok, out) = restore(&file, &new.data_dir(1), 1, &members);
    assert!(!ok && out.contains("not empty"), "{out}");
    std::fs::remove_dir_all(new.data_dir(1)).unwrap();

    for id in 1..=3 {
        let (ok, out) = restore(&file, &new.data_dir(id), id, &members);
        assert!(ok, "{out}");
    }
    for id in 1..=3 {
        new.spawn(id, &["--initial-members", &members]);
    }
    new.wait_for_leader(Duration::from_secs(30)).await;
    let restored_info = new.registry_info(1).await;
    assert_eq!(restored_info["keys"], info["keys"], "the same signing keys");
    for id in 1..=3 {
        assert_eq!(new.contents(id).await, expected, "node {id}");
    }
    for agent in expected.keys().take(20) {
        let record = new.get(2, agent).await;
        verify_with_identity(&record, &identity).expect("the original's keys verify it");
    }
    // Tombstones came along: a deleted id is gone (410), not unknown.
    let gone = new
        .http
        .get(format!("{}/agents/kept-0", new.http_url(3)))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 410);
    // The new cluster takes writes, signed with the same keys.
    let (status, body) = new.register(3, "after-restore", "New.").await;
    assert_eq!(status, 201, "{body}");
    verify_with_identity(&body, &identity).expect("signed with the restored keys");

    // A node added later is brought up by a snapshot, built on demand: the
    // restored log starts after the backup's last entry.
    new.reserve(4);
    new.spawn(4, &["--bootstrap", "manual"]);
    let raft4 = format!("127.0.0.1:{}", new.nodes[&4].raft);
    let (ok, out) = agentry(&[
        "cluster",
        "add",
        "4",
        &raft4,
        "--wait",
        "--server",
        &new.grpc_url(1),
    ]);
    assert!(ok, "{out}");
    // The leader applied the last write before it answered.
    let leader = new.wait_for_leader(Duration::from_secs(10)).await;
    let want = new.contents(leader).await;
    assert_eq!(want.len(), expected.len() + 1);
    for _ in 0..100 {
        if new.contents(4).await == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(new.contents(4).await, want);
}
