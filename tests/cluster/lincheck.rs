//! Linearizability under faults: concurrent clients register, update,
//! delete and read (linearizable) agents through random nodes while a
//! nemesis partitions, slows, drops and kills; every history is then checked
//! against the sequential model of one agent record.
//!
//! CI size: 10 fault schedules × 2,000 operations. Stress mode:
//! `AGENTRY_LINCHECK_OPS=20000 AGENTRY_LINCHECK_ROUNDS=5 ./scripts/test.sh
//! histories_under_faults -- --nocapture` (operations per schedule, rounds
//! of all schedules).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry::pb;
use serde_json::Value;

use crate::harness::*;
use crate::linearizability::{check_partitioned, Model, Operation, Verdict};
use crate::scenarios::SERIAL;

/// One agent record as clients can observe it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Agent {
    Absent,
    Live(u32),
    Deleted,
}

#[derive(Debug, Clone)]
enum Input {
    Register(u32),
    Update(u32),
    Delete,
    Get,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Created,
    Updated,
    Done,
    NotFound,
    Gone,
    Value(u32),
}

impl Model for Agent {
    type Input = Input;
    type Output = Output;

    /// The registry's write rules for one owner and one endpoint: POST
    /// creates (also over a tombstone) or refreshes; PUT and DELETE need a
    /// live record (404 never existed, 410 deleted).
    fn step(&self, input: &Input, output: Option<&Output>) -> Option<Self> {
        use Agent::*;
        let (next, expected) = match (self, input) {
            (Absent | Deleted, Input::Register(v)) => (Live(*v), Output::Created),
            (Live(_), Input::Register(v)) => (Live(*v), Output::Updated),
            (Live(_), Input::Update(v)) => (Live(*v), Output::Done),
            (Live(_), Input::Delete) => (Deleted, Output::Done),
            (Live(v), Input::Get) => (Live(*v), Output::Value(*v)),
            (Absent, _) => (Absent, Output::NotFound),
            (Deleted, _) => (Deleted, Output::Gone),
        };
        match output {
            Some(o) if *o != expected => None,
            _ => Some(next),
        }
    }
}

/// What one HTTP call means for the history.
enum Outcome {
    /// It happened with this result.
    Definite(Output),
    /// It may or may not have happened.
    Unknown,
    /// It certainly had no effect (refused before anything was done, or a
    /// failed read): left out of the history.
    NoEffect,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const CLIENTS: usize = 8;

async fn perform(http: &reqwest::Client, base: &str, id: &str, input: &Input) -> Outcome {
    let url = format!("{base}/agents/{id}");
    let sent = match input {
        Input::Register(v) => http
            .post(format!("{base}/agents"))
            .bearer_auth(ADMIN)
            .json(&agent(id, &format!("v{v}")))
            .send(),
        Input::Update(v) => http
            .put(&url)
            .bearer_auth(ADMIN)
            .json(&agent(id, &format!("v{v}")))
            .send(),
        Input::Delete => http.delete(&url).bearer_auth(ADMIN).send(),
        Input::Get => http
            .get(format!("{url}?consistency=linearizable"))
            .bearer_auth(ADMIN)
            .send(),
    };
    let is_read = matches!(input, Input::Get);
    let resp = match sent.await {
        Ok(r) => r,
        // Never connected: the node was down; nothing was sent.
        Err(e) if e.is_connect() => return Outcome::NoEffect,
        Err(_) if is_read => return Outcome::NoEffect,
        Err(_) => return Outcome::Unknown,
    };
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or_default();
    let output = match (input, status) {
        (Input::Register(_), 201) => Output::Created,
        (Input::Register(_), 200) => Output::Updated,
        (Input::Update(_) | Input::Delete, 200) => Output::Done,
        (Input::Get, 200) => {
            let v = body["description"]
                .as_str()
                .and_then(|d| d.strip_prefix('v'))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected record {body}"));
            Output::Value(v)
        }
        (_, 404) => Output::NotFound,
        (_, 410) => Output::Gone,
        // 503: refused before anything was proposed (no leader reachable).
        (_, 503) => return Outcome::NoEffect,
        (_, 504) if is_read => return Outcome::NoEffect,
        (_, 504) => return Outcome::Unknown,
        (_, s) => panic!("unexpected answer {s} to {input:?} on {id}: {body}"),
    };
    Outcome::Definite(output)
}

type History = Vec<(u64, Operation<Input, Output>)>;

/// What every client of one schedule shares.
#[derive(Clone)]
struct Workload {
    urls: Arc<Vec<String>>,
    prefix: String,
    /// Operations per client.
    ops: usize,
    keys: u64,
    start: Instant,
    history: Arc<Mutex<History>>,
}

/// One client: random operations on random agents through random nodes.
async fn client(n: usize, seed: u64, w: Workload) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(4))
        .build()
        .expect("client");
    let mut rng = Rng(seed | 1);
    for seq in 0..w.ops {
        let key = rng.below(w.keys);
        let id = format!("{}-k{key}", w.prefix);
        let value = (n as u32) << 20 | seq as u32;
        let input = match rng.below(100) {
            0..=29 => Input::Register(value),
            30..=49 => Input::Update(value),
            50..=62 => Input::Delete,
            _ => Input::Get,
        };
        let node = &w.urls[rng.below(w.urls.len() as u64) as usize];
        let call = w.start.elapsed().as_nanos() as u64;
        let outcome = perform(&http, node, &id, &input).await;
        let ret = w.start.elapsed().as_nanos() as u64;
        let op = match outcome {
            Outcome::Definite(o) => Operation {
                client: n,
                call,
                ret: Some(ret),
                input,
                output: Some(o),
            },
            Outcome::Unknown => Operation {
                client: n,
                call,
                ret: None,
                input,
                output: None,
            },
            Outcome::NoEffect => continue,
        };
        w.history.lock().unwrap().push((key, op));
    }
}

/// A fault schedule, applied in rounds until the clients finish.
#[derive(Debug, Clone, Copy)]
enum Nemesis {
    Calm,
    PartitionLeader,
    IsolateFollower,
    DropMessages,
    SlowAndLossy,
    KillLeader,
    KillFollower,
    RotatingPartitions,
    KillLeaderUnderDelay,
    AsymmetricCut,
}

const SCHEDULES: [Nemesis; 10] = [
    Nemesis::Calm,
    Nemesis::PartitionLeader,
    Nemesis::IsolateFollower,
    Nemesis::DropMessages,
    Nemesis::SlowAndLossy,
    Nemesis::KillLeader,
    Nemesis::KillFollower,
    Nemesis::RotatingPartitions,
    Nemesis::KillLeaderUnderDelay,
    Nemesis::AsymmetricCut,
];

async fn leader_of(c: &Cluster) -> Option<u64> {
    for id in c.running() {
        if let Some(s) = c.status(id).await {
            if s.leader_id != 0 && c.is_running(s.leader_id) {
                return Some(s.leader_id);
            }
        }
    }
    None
}

/// One round of faults: apply, hold, undo.
async fn disturb(c: &mut Cluster, nemesis: Nemesis, round: u64) {
    let hold = Duration::from_millis(600);
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let leader = leader_of(c).await.unwrap_or(ids[0]);
    let follower = *ids
        .iter()
        .filter(|&&n| n != leader)
        .nth((round % 2) as usize)
        .unwrap_or(&ids[0]);
    let lossy = |drop_rate: f64, delay_ms: u32| pb::LinkFault {
        drop_rate,
        delay_ms,
        ..Default::default()
    };
    match nemesis {
        Nemesis::Calm => tokio::time::sleep(hold).await,
        Nemesis::PartitionLeader => {
            let rest: Vec<u64> = ids.iter().copied().filter(|&n| n != leader).collect();
            c.partition(&[&[leader], &rest]).await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
        Nemesis::IsolateFollower => {
            let rest: Vec<u64> = ids.iter().copied().filter(|&n| n != follower).collect();
            c.partition(&[&[follower], &rest]).await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
        Nemesis::DropMessages => {
            c.everywhere(lossy(0.3, 0)).await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
        Nemesis::SlowAndLossy => {
            c.everywhere(lossy(0.1, 30)).await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
        Nemesis::KillLeader => {
            c.kill(leader);
            tokio::time::sleep(hold).await;
            c.restart(leader);
        }
        Nemesis::KillFollower => {
            c.kill(follower);
            tokio::time::sleep(hold).await;
            c.restart(follower);
        }
        Nemesis::RotatingPartitions => {
            let alone = ids[(round as usize) % ids.len()];
            let rest: Vec<u64> = ids.iter().copied().filter(|&n| n != alone).collect();
            c.partition(&[&[alone], &rest]).await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
        Nemesis::KillLeaderUnderDelay => {
            c.everywhere(lossy(0.0, 20)).await;
            c.kill(leader);
            tokio::time::sleep(hold).await;
            c.restart(leader);
            c.heal().await;
        }
        Nemesis::AsymmetricCut => {
            // The leader and one follower cannot talk; the other follower
            // still sees both.
            c.set_faults(
                leader,
                vec![pb::LinkFault {
                    peer: follower,
                    blocked: true,
                    ..Default::default()
                }],
            )
            .await;
            c.set_faults(
                follower,
                vec![pb::LinkFault {
                    peer: leader,
                    blocked: true,
                    ..Default::default()
                }],
            )
            .await;
            tokio::time::sleep(hold).await;
            c.heal().await;
        }
    }
    // A calm spell between faults, so operations also run on a healed
    // cluster that is catching up.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_under_faults_are_linearizable() {
    let _serial = SERIAL.lock().await;
    let ops = env_or("AGENTRY_LINCHECK_OPS", 2000);
    let rounds = env_or("AGENTRY_LINCHECK_ROUNDS", 1);
    // About 400 operations per agent keeps each key's history small enough
    // for the checker even when many outcomes are unknown.
    let keys = (ops as u64 / 400).max(5);
    let mut c = Cluster::start(
        3,
        Options {
            request_timeout_secs: Some(1),
            snapshot_logs: Some(500),
            election_timeout_ms: Some(400),
            ..Default::default()
        },
    )
    .await;
    let urls: Arc<Vec<String>> = Arc::new(c.nodes.keys().map(|&n| c.http_url(n)).collect());
    for round in 0..rounds {
        for (s, nemesis) in SCHEDULES.iter().enumerate() {
            let started = Instant::now();
            let prefix = format!("lin-r{round}-s{s}");
            let history = Arc::new(Mutex::new(Vec::new()));
            let workload = Workload {
                urls: urls.clone(),
                prefix: prefix.clone(),
                ops: ops / CLIENTS,
                keys,
                start: Instant::now(),
                history: history.clone(),
            };
            let clients: Vec<_> = (0..CLIENTS)
                .map(|n| {
                    let seed = 0x9e37_79b9_7f4a_7c15
                        ^ ((round as u64) << 40)
                        ^ ((s as u64) << 20)
                        ^ n as u64;
                    tokio::spawn(client(n, seed, workload.clone()))
                })
                .collect();
            let mut faults = 0;
            while !clients.iter().all(|h| h.is_finished()) {
                disturb(&mut c, *nemesis, faults).await;
                faults += 1;
            }
            for h in clients {
                h.await.expect("client task");
            }
            c.heal().await;
            c.wait_for_leader(Duration::from_secs(30)).await;

            let history = history.lock().unwrap().clone();
            let unknown = history.iter().filter(|(_, o)| o.ret.is_none()).count();
            let verdict = check_partitioned(|_: &u64| Agent::Absent, &history, 50_000_000);
            eprintln!(
                "schedule {s} {nemesis:?}: {} operations recorded ({unknown} of unknown outcome), {faults} fault rounds, {:.1} s: {verdict}",
                history.len(),
                started.elapsed().as_secs_f64()
            );
            match verdict {
                Verdict::Linearizable => {}
                other => panic!("schedule {s} {nemesis:?} (prefix {prefix}): {other}"),
            }
            assert!(
                history.len() >= ops / 2,
                "schedule {s}: too few operations took effect ({})",
                history.len()
            );
        }
    }
}
