//! A cluster of real `agentry` processes on loopback: each node has its own
//! data directory and fixed ports (so a restarted node comes back at the
//! same address), can be killed with SIGKILL and restarted, and has network
//! fault rules (drop, delay, partition) set through the admin API.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentry::pb::{self, cluster_client::ClusterClient};
use serde_json::{json, Value};

#[path = "../common/ports.rs"]
mod ports;
use ports::free_port;

pub const ADMIN: &str = "cluster-test-admin-key";
/// Every node of a test cluster proves membership with this secret.
pub const CLUSTER_SECRET: &str = "cluster-test-secret-0123456789";

/// Extra `serve` flags for every node.
#[derive(Clone, Default)]
pub struct Options {
    pub snapshot_logs: Option<u64>,
    pub request_timeout_secs: Option<u64>,
    /// Faster failure detection (heartbeat is a tenth of it).
    pub election_timeout_ms: Option<u64>,
    /// More TOML for every node's config file.
    pub extra_config: String,
    /// The nodes' log filter (default: warnings and errors).
    pub log: Option<&'static str>,
}

pub struct Node {
    pub id: u64,
    pub grpc: u16,
    pub http: u16,
    pub raft: u16,
    /// The peer (federation) listener.
    pub peer: u16,
    child: Option<Child>,
    /// The extra flags it was first started with, reused on restart.
    extra: Vec<String>,
    /// TOML for this node alone, after the cluster's (`configure_node`).
    config: String,
}

pub struct Cluster {
    pub nodes: BTreeMap<u64, Node>,
    dir: tempfile::TempDir,
    options: Options,
    pub http: reqwest::Client,
    /// Small filesystems mounted under data directories, unmounted on drop.
    mounts: Vec<PathBuf>,
}

impl Cluster {
    /// Sets more TOML for the nodes started from now on.
    pub fn configure(&mut self, toml: &str) {
        self.options.extra_config = toml.to_string();
    }

    /// Sets more TOML for node `id` alone, from its next start on.
    pub fn configure_node(&mut self, id: u64, toml: &str) {
        self.nodes.get_mut(&id).expect("reserved node").config = toml.to_string();
    }

    /// The TOML node `id` alone is started with.
    pub fn node_config(&self, id: u64) -> &str {
        &self.nodes[&id].config
    }

    /// Where to put files for this cluster's nodes.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// An empty harness; add nodes with `spawn`.
    pub fn new(options: Options) -> Self {
        Self {
            nodes: BTreeMap::new(),
            dir: tempfile::tempdir().expect("tempdir"),
            options,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            mounts: Vec::new(),
        }
    }

    /// Puts node `id`'s data directory on a tmpfs of `bytes` (before the
    /// node first starts): a disk the test can fill. Needs root, as CI has.
    pub fn small_disk(&mut self, id: u64, bytes: u64) -> PathBuf {
        let dir = self.data_dir(id);
        std::fs::create_dir_all(&dir).expect("data dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a tmpfs failed (the disk tests need root)"
        );
        self.mounts.push(dir.clone());
        dir
    }

    /// Waits up to `timeout` for node `id`'s process to exit by itself.
    pub fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let node = self.nodes.get_mut(&id)?;
        loop {
            let child = node.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                node.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts `n` nodes that bootstrap from a static member list and waits
    /// until they agree on a leader.
    pub async fn start(n: u64, options: Options) -> Self {
        let mut c = Self::new(options);
        for id in 1..=n {
            c.reserve(id);
        }
        let members = c.member_list();
        for id in 1..=n {
            c.spawn(id, &["--initial-members", &members]);
        }
        c.wait_for_leader(Duration::from_secs(30)).await;
        c
    }

    /// Picks ports for a node id.
    pub fn reserve(&mut self, id: u64) {
        self.nodes.insert(
            id,
            Node {
                id,
                grpc: free_port(),
                http: free_port(),
                raft: free_port(),
                peer: free_port(),
                child: None,
                extra: Vec::new(),
                config: String::new(),
            },
        );
    }

    pub fn member_list(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("{}=127.0.0.1:{}", n.id, n.raft))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What node `id` has logged (warnings and errors) so far.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node-{id}.log"))).unwrap_or_default()
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    /// Starts the process of node `id` (reserved before) with extra flags,
    /// and waits for its ready line.
    pub fn spawn(&mut self, id: u64, extra: &[&str]) {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        self.nodes.get_mut(&id).expect("reserved node").extra = extra;
        self.launch(id);
    }

    fn launch(&mut self, id: u64) {
        if let Err(why) = self.try_launch(id) {
            panic!("{why}");
        }
    }

    /// Starts node `id`; a process that exits before its ready line is
    /// reported with the tail of its log (the temporary directory, and the
    /// log with it, is gone once CI ends).
    fn try_launch(&mut self, id: u64) -> Result<(), String> {
        let data_dir = self.data_dir(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .expect("log file");
        let node = self.nodes.get(&id).expect("reserved node");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentry"));
        cmd.arg("serve")
            .args(["--node-id", &id.to_string()])
            .args(["--grpc-addr", &format!("127.0.0.1:{}", node.grpc)])
            .args(["--http-addr", &format!("127.0.0.1:{}", node.http)])
            .args(["--raft-addr", &format!("127.0.0.1:{}", node.raft)])
            .args(["--peer-addr", &format!("127.0.0.1:{}", node.peer)])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--fault-injection")
            .args(&node.extra)
            .env("AGENTRY_ADMIN_KEY", ADMIN)
            .env("AGENTRY_CLUSTER_SECRET", CLUSTER_SECRET)
            .env("AGENTRY_LOG", self.options.log.unwrap_or("warn"))
            .env_remove("AGENTRY_CONFIG")
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(s) = self.options.snapshot_logs {
            cmd.args(["--snapshot-logs", &s.to_string()]);
        }
        // Tests drive nodes far harder than a client should; limits have
        // tests of their own.
        let mut config =
            String::from("snapshot_keep_logs = 20\nrate_limits = { enabled = false }\n");
        if let Some(t) = self.options.request_timeout_secs {
            config.push_str(&format!("request_timeout_secs = {t}\n"));
        }
        if let Some(e) = self.options.election_timeout_ms {
            config.push_str(&format!(
                "election_timeout_ms = {e}\nheartbeat_ms = {}\n",
                e / 10
            ));
        }
        config.push_str(&self.options.extra_config);
        config.push_str(&self.nodes[&id].config);
        let path = self.dir.path().join(format!("node-{id}.toml"));
        std::fs::write(&path, config).expect("config");
        cmd.arg("--config").arg(path);
        let mut child = cmd.spawn().expect("agentry starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("ready line");
        if !line.starts_with("agentry ready") {
            let _ = child.wait();
            return Err(format!(
                "node {id} did not start: {line:?}; its log ends:\n{}",
                tail(&self.log(id), 40)
            ));
        }
        self.nodes.get_mut(&id).expect("reserved").child = Some(child);
        Ok(())
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|n| n.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: the node's own graceful stop (a leader hands over first).
    pub fn terminate(&self, id: u64) {
        self.signal(id, "-TERM");
    }

    /// Sends node `id` the signal `kill` names `flag` (`-HUP`).
    pub fn signal(&self, id: u64, flag: &str) {
        if let Some(child) = self.nodes.get(&id).and_then(|n| n.child.as_ref()) {
            let status = Command::new("kill")
                .args([flag, &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success());
        }
    }

    /// Starts a killed node again with the same data directory, ports and
    /// flags.
    pub fn restart(&mut self, id: u64) {
        self.launch(id);
    }

    /// What a supervisor (systemd's `Restart=always`, a pod's restart
    /// policy) does: starts node `id` again, up to `attempts` times a
    /// second apart, until one start reaches its ready line. Each failed
    /// start is printed with its log.
    pub fn restart_supervised(&mut self, id: u64, attempts: usize) {
        for attempt in 1..=attempts {
            match self.try_launch(id) {
                Ok(()) => return,
                Err(why) if attempt < attempts => {
                    eprintln!("start {attempt} of node {id} failed: {why}");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(why) => panic!("{attempts} starts failed; the last: {why}"),
            }
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.child.is_some())
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|n| n.child.is_some())
            .map(|n| n.id)
            .collect()
    }

    pub fn http_url(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.nodes[&id].http)
    }

    pub fn grpc_url(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.nodes[&id].grpc)
    }

    pub async fn admin(&self, id: u64) -> ClusterClient<tonic::transport::Channel> {
        ClusterClient::connect(self.grpc_url(id))
            .await
            .expect("cluster client")
    }

    pub fn request<T>(msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {ADMIN}").parse().expect("header"),
        );
        req.set_timeout(Duration::from_secs(5));
        req
    }

    pub async fn status(&self, id: u64) -> Option<pb::ClusterStatus> {
        let mut c = ClusterClient::connect(self.grpc_url(id)).await.ok()?;
        c.status(Self::request(pb::ClusterStatusRequest {}))
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    /// Waits until every running node names the same leader, and that
    /// leader is running; returns it.
    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        self.wait_for_leader_among(&self.running(), timeout).await
    }

    /// Waits until nodes `ids` name the same running leader; returns it.
    pub async fn wait_for_leader_among(&self, ids: &[u64], timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = Vec::new();
            for &id in ids {
                leaders.push(self.status(id).await.map(|s| s.leader_id).unwrap_or(0));
            }
            if let Some(&l) = leaders.first() {
                if l != 0 && self.is_running(l) && leaders.iter().all(|x| *x == l) {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The cluster id node `id` reports, once its cluster's leader has
    /// founded it (a second or so after every member first answered it).
    pub async fn wait_cluster_id(&self, id: u64, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .status(id)
                .await
                .and_then(|s| s.node)
                .map(|n| n.cluster_id)
                .unwrap_or_default();
            if !found.is_empty() {
                return found;
            }
            assert!(Instant::now() < deadline, "node {id} knows no cluster id");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running node has applied what node `leader` had
    /// applied when asked.
    pub async fn wait_applied_as(&self, leader: u64, timeout: Duration) {
        let applied = self
            .status(leader)
            .await
            .and_then(|s| s.node)
            .map(|n| n.applied_index)
            .unwrap_or(0);
        self.wait_applied(applied, timeout).await;
    }

    /// Waits until every running node has applied revision `revision`
    /// (`/readyz`; a revision is not a log index once writes are batched).
    pub async fn wait_revision(&self, revision: u64, timeout: Duration) {
        self.wait_each("revision ", revision, timeout, async |id| {
            let ready: Value = match self
                .http
                .get(format!("{}/readyz", self.http_url(id)))
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => Value::Null,
            };
            ready["applied_revision"].as_u64().unwrap_or(0)
        })
        .await
    }

    /// Waits until every running node has applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) {
        self.wait_each("", index, timeout, async |id| {
            self.status(id)
                .await
                .and_then(|s| s.node)
                .map(|n| n.applied_index)
                .unwrap_or(0)
        })
        .await
    }

    /// Polls `applied` of every running node until it reaches `target`;
    /// fails the test at `timeout`.
    async fn wait_each(
        &self,
        what: &str,
        target: u64,
        timeout: Duration,
        applied: impl AsyncFn(u64) -> u64,
    ) {
        let deadline = Instant::now() + timeout;
        for id in self.running() {
            loop {
                let at = applied(id).await;
                if at >= target {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} applied {what}{at}, not {target}, within {timeout:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Replaces node `id`'s fault rules.
    pub async fn set_faults(&self, id: u64, faults: Vec<pb::LinkFault>) {
        let mut c = self.admin(id).await;
        c.set_faults(Self::request(pb::SetFaultsRequest { faults }))
            .await
            .expect("set faults");
    }

    /// Splits the running nodes into groups that cannot talk to each other.
    pub async fn partition(&self, groups: &[&[u64]]) {
        for group in groups {
            for &id in *group {
                if !self.is_running(id) {
                    continue;
                }
                let faults = self
                    .nodes
                    .keys()
                    .filter(|p| !group.contains(p))
                    .map(|&peer| pb::LinkFault {
                        peer,
                        blocked: true,
                        ..Default::default()
                    })
                    .collect();
                self.set_faults(id, faults).await;
            }
        }
    }

    /// Applies the same rule towards every peer on every running node.
    pub async fn everywhere(&self, rule: pb::LinkFault) {
        for id in self.running() {
            let faults = self
                .nodes
                .keys()
                .filter(|p| **p != id)
                .map(|&peer| pb::LinkFault { peer, ..rule })
                .collect();
            self.set_faults(id, faults).await;
        }
    }

    /// Removes every fault rule.
    pub async fn heal(&self) {
        for id in self.running() {
            self.set_faults(id, Vec::new()).await;
        }
    }

    /// Registers `id` through node `via`; the HTTP status and body.
    pub async fn register(&self, via: u64, id: &str, description: &str) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/agents", self.http_url(via)))
            .bearer_auth(ADMIN)
            .json(&agent(id, description))
            .send()
            .await;
        match resp {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or_default())
            }
            Err(e) => (0, json!({"transport": e.to_string()})),
        }
    }

    /// Node `id`'s `/metrics`, as text.
    pub async fn metrics(&self, id: u64) -> String {
        self.http
            .get(format!("{}/metrics", self.http_url(id)))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// The value of node `id`'s sample `name` whose labels include every
    /// one of `labels` (`peer="b.example"`), if `/metrics` has one.
    pub async fn sample(&self, id: u64, name: &str, labels: &[&str]) -> Option<u64> {
        self.metrics(id)
            .await
            .lines()
            .find(|l| {
                l.starts_with(name)
                    && l[name.len()..].starts_with([' ', '{'])
                    && labels.iter().all(|x| l.contains(x))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// `/.well-known/agentry.json` of node `id`, once the cluster has
    /// established its identity.
    pub async fn registry_info(&self, id: u64) -> Value {
        for _ in 0..100 {
            let info: Value = self
                .http
                .get(format!("{}/.well-known/agentry.json", self.http_url(id)))
                .send()
                .await
                .expect("registry info")
                .json()
                .await
                .expect("registry info json");
            if info["established"] == true {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node {id} never published an established identity");
    }

    /// One record as node `id` serves it.
    pub async fn get(&self, id: u64, agent: &str) -> Value {
        self.get_json(id, &format!("/agents/{agent}")).await
    }

    /// Node `id`'s answer to an anonymous `POST /discover` of `request`.
    pub async fn discover(&self, id: u64, request: Value) -> Value {
        self.http
            .post(format!("{}/discover", self.http_url(id)))
            .json(&request)
            .send()
            .await
            .expect("discover")
            .json()
            .await
            .expect("discover body")
    }

    /// The JSON body of node `id`'s answer to an admin's GET of `path`.
    pub async fn get_json(&self, id: u64, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.http_url(id)))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("get json")
    }

    /// Every live record's id → description and registry signature on node
    /// `id`, read locally (so equal contents mean identical signatures too).
    pub async fn contents(&self, id: u64) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut token = String::new();
        let mut waits = 0;
        loop {
            let url = format!(
                "{}/agents?page_size=200{}",
                self.http_url(id),
                if token.is_empty() {
                    String::new()
                } else {
                    format!("&page_token={token}")
                }
            );
            let response = self
                .http
                .get(&url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("list");
            let status = response.status();
            let page: Value = response.json().await.expect("list json");
            // A node installing a snapshot answers 503 until it is done, and
            // says when to come back; the test does as a client would.
            if status == 503 && installing(&page) && waits < 150 {
                waits += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            let Some(agents) = page["agents"].as_array() else {
                panic!("listing node {id}: {status} {page}");
            };
            for a in agents {
                out.insert(
                    a["id"].as_str().unwrap_or_default().to_string(),
                    format!(
                        "{} | {}",
                        a["description"].as_str().unwrap_or_default(),
                        a["registry"]["signature"]["value"]
                            .as_str()
                            .unwrap_or("unsigned")
                    ),
                );
            }
            match page["next_page_token"].as_str() {
                Some(t) if !t.is_empty() => token = t.to_string(),
                _ => break,
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        let mut report = String::new();
        for n in self.nodes.values_mut() {
            if let Some(mut c) = n.child.take() {
                if let Ok(Some(exit)) = c.try_wait() {
                    report.push_str(&format!("node {} had exited: {exit}\n", n.id));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if failed {
            // CI keeps the test's output but not its temporary directory:
            // what each node last logged, and RocksDB's own errors (its
            // LOG sits on a mount that is gone once the test ends).
            for id in self.nodes.keys() {
                let db_log =
                    std::fs::read_to_string(self.data_dir(*id).join("db/LOG")).unwrap_or_default();
                let db_errors: Vec<&str> = db_log
                    .lines()
                    .filter(|l| {
                        l.contains("[ERROR]") || l.contains("[WARN]") || l.contains(" error:")
                    })
                    .collect();
                report.push_str(&format!(
                    "node {id}'s log ends:\n{}\nRocksDB's last errors on node {id}:\n{}\n",
                    tail(&self.log(*id), 30),
                    tail(&db_errors.join("\n"), 10)
                ));
            }
            eprintln!("{report}");
        }
        for dir in &self.mounts {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
        if failed {
            // Keep the logs of a failed run.
            let path = self.dir.path().to_path_buf();
            eprintln!("cluster logs kept in {}", path.display());
            std::mem::forget(std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("tempdir"),
            ));
        }
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let skip = text.lines().count().saturating_sub(lines);
    text.lines().skip(skip).collect::<Vec<_>>().join("\n")
}

/// A small valid agent record.
pub fn agent(id: &str, description: &str) -> Value {
    json!({
        "id": id,
        "name": format!("Agent {id}"),
        "description": description,
        "tags": ["cluster-test"],
        "bindings": [{"protocol": "https", "endpoint": format!("https://agents.example/{id}")}],
    })
}

/// Whether a problem body says its node is installing a snapshot.
fn installing(problem: &Value) -> bool {
    problem["detail"]
        .as_str()
        .is_some_and(|d| d.contains("installing a snapshot"))
}
