//! Durability: every acknowledged write survives kill -9 of the process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::json;

use crate::harness::*;

struct Proc {
    child: Child,
    http: String,
}

fn spawn(data_dir: &std::path::Path) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--raft-addr",
            "127.0.0.1:0",
            "--peer-addr",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data_dir)
        .env("AGENTRY_ADMIN_KEY", ADMIN)
        .env("AGENTRY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agentry starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("ready line");
    let http = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http address in {line:?}"))
        .to_string();
    Proc {
        child,
        http: format!("http://{http}"),
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = spawn(dir.path());
    let h = Http::new(&p.http);
    let mut acknowledged = Vec::new();
    for i in 0..40 {
        let id = format!("durable-{i:03}");
        let mut m = minimal(&id);
        m["tags"] = json!(["durable"]);
        let (rec, _) = h.register(Some(ADMIN), m).await.expect("acknowledged");
        acknowledged.push((id, rec["registry"]["revision"].as_u64().unwrap()));
    }
    h.delete(Some(ADMIN), "durable-000")
        .await
        .expect("delete acknowledged");
    p.child.kill().expect("SIGKILL");
    p.child.wait().unwrap();

    let mut p = spawn(dir.path());
    let h = Http::new(&p.http);
    for (id, rev) in &acknowledged[1..] {
        let rec = h
            .get(None, id)
            .await
            .unwrap_or_else(|e| panic!("{id} lost after kill -9: {e:?}"));
        assert_eq!(
            rec["registry"]["revision"].as_u64(),
            Some(*rev),
            "{id} kept its revision"
        );
    }
    assert_eq!(
        h.get(None, "durable-000").await.unwrap_err().http,
        410,
        "the tombstone survived too"
    );
    // The restarted node did not re-initialise: new writes get later revisions.
    let (rec, _) = h
        .register(Some(ADMIN), minimal("after-restart"))
        .await
        .unwrap();
    assert!(rec["registry"]["revision"].as_u64().unwrap() > acknowledged.last().unwrap().1);
    p.child.kill().unwrap();
    p.child.wait().unwrap();
}
