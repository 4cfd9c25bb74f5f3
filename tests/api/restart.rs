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
    spawn_with(data_dir, &[])
}

fn spawn_with(data_dir: &std::path::Path, args: &[&std::ffi::OsStr]) -> Proc {
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
        .args(args)
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

/// SIGTERM, and waits for the node's own graceful stop.
fn terminate(mut p: Proc) {
    let status = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let stopped = p.child.wait().expect("the node stops");
    assert!(stopped.success(), "a clean stop: {stopped:?}");
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

/// A sample of the node's `/metrics` page, by metric name.
async fn gauge(h: &Http, name: &str) -> Option<f64> {
    let page = reqwest::get(format!("{}/metrics", h.base))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// (id, score, best matched example) of each candidate, best first.
async fn ranked(h: &Http) -> Vec<(String, f64, String)> {
    let (status, _, body) = h
        .send(
            reqwest::Method::POST,
            "/discover",
            None,
            Some(
                json!({"query": "book a flight to Rome for next Friday", "include_evidence": true}),
            ),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["score"].as_f64().unwrap(),
                c["matched_examples"][0]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

async fn indexed(h: &Http, agents: f64) {
    eventually(
        std::time::Duration::from_secs(30),
        "the restarted node indexes every agent",
        || async { gauge(h, "agentry_discovery_indexed_agents").await == Some(agents) },
    )
    .await;
}

/// The node restarted on `dir` once it has indexed its three agents, with
/// how many of them its index build took from stored vectors.
async fn restarted(dir: &std::path::Path, args: &[&std::ffi::OsStr]) -> (Proc, Http, Option<f64>) {
    let p = spawn_with(dir, args);
    let h = Http::new(&p.http);
    indexed(&h, 3.0).await;
    let reused = gauge(&h, "agentry_discovery_last_rebuild_reused_vectors").await;
    (p, h, reused)
}

#[tokio::test]
async fn a_restart_reuses_stored_vectors_unless_what_they_came_from_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = spawn(dir.path());
    let h = Http::new(&p.http);
    for (id, description, examples) in [
        (
            "flights",
            "Books flights and trains.",
            ["book a flight to Rome", "find a train to Lyon"],
        ),
        (
            "hotels",
            "Finds hotels and apartments.",
            ["a hotel near the beach", "cheap rooms in Rome"],
        ),
        (
            "weather",
            "Weather forecasts.",
            ["will it rain tomorrow", "temperature in Oslo"],
        ),
    ] {
        let mut m = minimal(id);
        m["description"] = json!(description);
        m["examples"] = json!(examples.map(|t| json!({"text": t})));
        h.register(Some(ADMIN), m).await.expect("registered");
    }
    indexed(&h, 3.0).await;
    let before = ranked(&h).await;
    assert_eq!(before[0].0, "flights", "{before:?}");
    assert_eq!(before[0].2, "book a flight to Rome", "{before:?}");
    let same_as_before = |after: Vec<(String, f64, String)>| {
        assert_eq!(after.len(), before.len());
        for (a, b) in after.iter().zip(&before) {
            assert_eq!((&a.0, &a.2), (&b.0, &b.2));
            assert!((a.1 - b.1).abs() < 1e-6, "{after:?} against {before:?}");
        }
    };
    // Stored vectors skip RocksDB's WAL: a kill -9 may lose those not yet
    // flushed, and the restart embeds them again, to the same answers.
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let (p, h, _) = restarted(dir.path(), &[]).await;
    same_as_before(ranked(&h).await);
    // A clean stop flushes them.
    terminate(p);

    // The same texts and model: every agent's vectors come from storage,
    // and the ranking, scores and evidence are what they were.
    let (mut p, h, reused) = restarted(dir.path(), &[]).await;
    assert_eq!(reused, Some(3.0));
    same_as_before(ranked(&h).await);
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    // Reusing them kept them: the next restart reuses them again.
    let (mut p, _, reused) = restarted(dir.path(), &[]).await;
    assert_eq!(reused, Some(3.0));
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    // A different profile mix makes other vectors: none is reused.
    let config = dir.path().join("weights.toml");
    std::fs::write(&config, "[discovery.weights]\nprofile_examples = 1.0\n").unwrap();
    let (mut p, h, reused) =
        restarted(dir.path(), &["--config".as_ref(), config.as_os_str()]).await;
    assert_eq!(reused, Some(0.0));
    assert_eq!(ranked(&h).await[0].0, "flights");
    p.child.kill().unwrap();
    p.child.wait().unwrap();
}

/// A generated admin key is kept only by a start that serves: when the
/// first start fails (a port taken), the next one makes and prints a key
/// instead of keeping a digest whose key nobody saw.
#[tokio::test]
async fn a_failed_first_start_keeps_no_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let serve = |http: String| {
        Command::new(env!("CARGO_BIN_EXE_agentry"))
            .args(["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr"])
            .arg(http)
            .args(["--raft-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("AGENTRY_ADMIN_KEY")
            .env("AGENTRY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("agentry starts")
    };
    let failed = serve(taken.local_addr().unwrap().to_string())
        .wait_with_output()
        .unwrap();
    assert!(!failed.status.success(), "the HTTP port is taken");
    let digest = dir.path().join("admin-key.sha256");
    assert!(!digest.exists(), "no digest of a key nobody saw");

    let mut node = serve("127.0.0.1:0".into());
    let stderr = BufReader::new(node.stderr.take().unwrap());
    let key = stderr
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("agk_").map(|k| format!("agk_{k}")))
        .expect("the generated key is printed");
    let stored = std::fs::read_to_string(&digest).unwrap();
    assert_eq!(stored.trim(), agentry::api::auth::key_digest(&key));
    let _ = node.kill();
    let _ = node.wait();
}

/// Stopping a node lets go of its database as soon as its own parts have
/// stopped: a restart, a rolling upgrade or a test does not wait out the
/// shutdown's grace period (10 s) for a database nothing uses any more.
#[tokio::test]
async fn a_stopped_node_closes_its_database_without_waiting_out_the_grace() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    h.register(Some(ALICE), minimal("stops")).await.unwrap();
    let started = std::time::Instant::now();
    s.stop().await;
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "shutdown took {took:?}"
    );
}

/// `agentry serve` on `data_dir` and the given listener addresses plus
/// `args`, run to its end (a start that fails, or `--check-config`).
fn serve_to_the_end(
    data_dir: &std::path::Path,
    grpc_addr: &str,
    args: &[&std::ffi::OsStr],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args([
            "serve",
            "--grpc-addr",
            grpc_addr,
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--raft-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("AGENTRY_ADMIN_KEY", ADMIN)
        .env("AGENTRY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("agentry runs")
}

/// A configuration that cannot serve stops the start before the node
/// creates its data directory, so it never initialises a cluster (with a
/// cluster id and secret of its own) that the corrected start would then
/// have to live with; `--check-config` finds the same faults, except a
/// port taken: it binds nothing, so it can check a running node's next
/// configuration.
#[tokio::test]
async fn a_configuration_that_cannot_serve_fails_before_it_touches_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let missing = dir.path().join("missing.pem");
    let not_keys = dir.path().join("keys.json");
    std::fs::write(&not_keys, "{\"keys\": \"none\"}").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let m = missing.as_os_str();
    let cases: [(&str, &str, Vec<&std::ffi::OsStr>, &str); 5] = [
        (
            "a TLS certificate that is not there",
            "127.0.0.1:0",
            vec!["--tls-cert".as_ref(), m, "--tls-key".as_ref(), m],
            "missing.pem",
        ),
        (
            "a signing key file that is not one",
            "127.0.0.1:0",
            vec!["--key-file".as_ref(), not_keys.as_os_str()],
            "identity.key_file",
        ),
        (
            "a cluster secret file that is not there",
            "127.0.0.1:0",
            vec!["--cluster-secret-file".as_ref(), m],
            "missing.pem",
        ),
        (
            "a member of a static cluster without its secret",
            "127.0.0.1:0",
            vec![
                "--node-id".as_ref(),
                "1".as_ref(),
                "--initial-members".as_ref(),
                "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3".as_ref(),
            ],
            "needs the cluster's secret",
        ),
        ("a port taken", &taken, vec![], "cannot bind"),
    ];
    for (case, grpc, args, says) in cases {
        let out = serve_to_the_end(&data, grpc, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case}: the start fails");
        assert!(stderr.contains(says), "{case}: {stderr}");
        assert!(!data.exists(), "{case}: the data directory is left alone");

        let mut checking = args.clone();
        checking.push("--check-config".as_ref());
        let out = serve_to_the_end(&data, grpc, &checking);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if case == "a port taken" {
            assert!(out.status.success(), "{case}: the check binds nothing");
        } else {
            assert!(!out.status.success(), "{case}: the check fails");
            assert!(stderr.contains(says), "{case}: {stderr}");
        }
        assert!(!data.exists(), "{case}: the check leaves it alone too");
    }
}

/// `--check-config` says what a start would run, creates nothing, and
/// reads what a node made on its first start once there is one.
#[tokio::test]
async fn check_config_says_what_would_run_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let generated = Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["keys", "generate", "--authority", "registry.example.com"])
        .output()
        .unwrap();
    assert!(generated.status.success());
    let key_file = dir.path().join("keys.json");
    std::fs::write(&key_file, &generated.stdout).unwrap();
    let args = [
        "--key-file".as_ref(),
        key_file.as_os_str(),
        "--no-embedder".as_ref(),
        "--check-config".as_ref(),
    ];
    let out = serve_to_the_end(&data, "127.0.0.1:0", &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for says in [
        "configuration ok",
        "(will be created)",
        "a single node, initialised on its first start",
        "a cluster secret generated on the first start",
        "admin key configured",
        "1 key(s) from the key file",
        "warning: discovery without an embedding model",
    ] {
        assert!(stdout.contains(says), "{says:?} in {stdout}");
    }
    assert!(!data.exists(), "nothing created");

    // A start on the same configuration, then the check again: it finds
    // the database and the secret the start made.
    let node = spawn_with(&data, &args[..3]);
    terminate(node);
    let out = serve_to_the_end(&data, "127.0.0.1:0", &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("(holds a node's database)"), "{stdout}");
    assert!(
        stdout.contains("the cluster secret stored in the data directory"),
        "{stdout}"
    );
}
