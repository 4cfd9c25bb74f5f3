//! Linearizability under faults: concurrent clients register, update,
//! delete and read (linearizable) agents through random nodes while a
//! nemesis partitions, slows, drops and kills; every history is then checked
//! against the sequential model of one agent record.
//!
//! A further schedule mixes in refreshes (`POST /agents/{id}/refresh`)
//! under leader kills, on agents whose own `expires_at` has passed, and
//! reads observe the lease through `registry.expired`: a refresh must keep
//! the record's value, a registration or update must end the hold.
//!
//! And one restarts nodes across the two Raft encodings: every node starts
//! writing and sending the previous one (JSON, `raft_encoding = "json"`),
//! then each round kills the leader and starts it in the other encoding, on
//! the log the first one wrote, while the others stay as they were (a
//! mixed cluster, as in a rolling upgrade).
//!
//! CI size: 12 fault schedules × 2,000 operations. Stress mode:
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
    /// The value, and whether a lease holds it fresh.
    Live(u32, bool),
    Deleted,
}

#[derive(Debug, Clone)]
enum Input {
    Register(u32),
    Update(u32),
    Delete,
    Refresh,
    Get,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Created,
    Updated,
    Done,
    NotFound,
    Gone,
    /// The value read, and whether it was fresh (None: a schedule that
    /// does not observe leases).
    Value(u32, Option<bool>),
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
            (Absent | Deleted, Input::Register(v)) => (Live(*v, false), Output::Created),
            // A new registration or an update ends the hold.
            (Live(..), Input::Register(v)) => (Live(*v, false), Output::Updated),
            (Live(..), Input::Update(v)) => (Live(*v, false), Output::Done),
            (Live(..), Input::Delete) => (Deleted, Output::Done),
            // A refresh keeps the value.
            (Live(v, _), Input::Refresh) => (Live(*v, true), Output::Done),
            (Live(v, held), Input::Get) => (Live(*v, *held), Output::Value(*v, Some(*held))),
            (Absent, _) => (Absent, Output::NotFound),
            (Deleted, _) => (Deleted, Output::Gone),
        };
        match (output, &expected) {
            (Some(Output::Value(got, None)), Output::Value(want, _)) => {
                (got == want).then_some(next)
            }
            (Some(o), _) if *o != expected => None,
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

/// `leased`: the schedule that refreshes; its agents' own `expires_at`
/// has passed, so only a lease keeps them fresh.
async fn perform(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    input: &Input,
    leased: bool,
) -> Outcome {
    let url = format!("{base}/agents/{id}");
    let record = |v: &u32| {
        let mut a = agent(id, &format!("v{v}"));
        if leased {
            a["expires_at"] = "2020-01-01T00:00:00Z".into();
        }
        a
    };
    let sent = match input {
        Input::Register(v) => http
            .post(format!("{base}/agents"))
            .bearer_auth(ADMIN)
            .json(&record(v))
            .send(),
        Input::Update(v) => http.put(&url).bearer_auth(ADMIN).json(&record(v)).send(),
        Input::Delete => http.delete(&url).bearer_auth(ADMIN).send(),
        Input::Refresh => http
            .post(format!("{url}/refresh"))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({"ttl_seconds": 3600}))
            .send(),
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
        (Input::Update(_) | Input::Delete | Input::Refresh, 200) => Output::Done,
        (Input::Get, 200) => {
            let v = body["description"]
                .as_str()
                .and_then(|d| d.strip_prefix('v'))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected record {body}"));
            let fresh = leased.then(|| body["registry"]["expired"] == false);
            Output::Value(v, fresh)
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
    /// Mix in refreshes (and observe leases on reads).
    refreshes: bool,
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
        let input = match (w.refreshes, rng.below(100)) {
            (false, 0..=29) => Input::Register(value),
            (false, 30..=49) => Input::Update(value),
            (false, 50..=62) => Input::Delete,
            (false, _) => Input::Get,
            (true, 0..=19) => Input::Register(value),
            (true, 20..=29) => Input::Update(value),
            (true, 30..=37) => Input::Delete,
            (true, 38..=64) => Input::Refresh,
            (true, _) => Input::Get,
        };
        let node = &w.urls[rng.below(w.urls.len() as u64) as usize];
        let call = w.start.elapsed().as_nanos() as u64;
        let outcome = perform(&http, node, &id, &input, w.refreshes).await;
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
    /// Kill the leader and restart it in the other Raft encoding.
    EncodingRollover,
}

/// Schedules after which the nodes run in the binary encoding again.
const ENCODING_SCHEDULES: [Nemesis; 1] = [Nemesis::EncodingRollover];

const JSON_ENCODING: &str = "raft_encoding = \"json\"\n";

/// Restarts every node in the JSON encoding (`json`) or the binary one,
/// one at a time, each on the log it has.
async fn all_in_encoding(c: &mut Cluster, json: bool) {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    for id in ids {
        if (c.node_config(id) == JSON_ENCODING) != json {
            c.kill(id);
            c.configure_node(id, if json { JSON_ENCODING } else { "" });
            c.restart(id);
            c.wait_for_leader(Duration::from_secs(30)).await;
        }
    }
}

/// Schedules with refreshes mixed in (the leased workload).
const REFRESH_SCHEDULES: [Nemesis; 1] = [Nemesis::KillLeader];

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
        Nemesis::EncodingRollover => {
            let json = c.node_config(leader) == JSON_ENCODING;
            c.kill(leader);
            c.configure_node(leader, if json { "" } else { JSON_ENCODING });
            tokio::time::sleep(hold).await;
            c.restart(leader);
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
        let all = SCHEDULES
            .iter()
            .map(|n| (n, false))
            .chain(REFRESH_SCHEDULES.iter().map(|n| (n, true)))
            .chain(ENCODING_SCHEDULES.iter().map(|n| (n, false)));
        for (s, (nemesis, refreshes)) in all.enumerate() {
            let started = Instant::now();
            let prefix = format!("lin-r{round}-s{s}");
            let rollover = matches!(nemesis, Nemesis::EncodingRollover);
            if rollover {
                all_in_encoding(&mut c, true).await;
            }
            let history = Arc::new(Mutex::new(Vec::new()));
            let workload = Workload {
                urls: urls.clone(),
                prefix: prefix.clone(),
                ops: ops / CLIENTS,
                keys,
                start: Instant::now(),
                history: history.clone(),
                refreshes,
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
            if rollover {
                all_in_encoding(&mut c, false).await;
            }

            let history = history.lock().unwrap().clone();
            let unknown = history.iter().filter(|(_, o)| o.ret.is_none()).count();
            let verdict = check_partitioned(|_: &u64| Agent::Absent, &history, 50_000_000);
            eprintln!(
                "schedule {s} {nemesis:?}{}: {} operations recorded ({unknown} of unknown outcome), {faults} fault rounds, {:.1} s: {verdict}",
                if refreshes { " with refreshes" } else { "" },
                history.len(),
                started.elapsed().as_secs_f64()
            );
            match verdict {
                Verdict::Linearizable => {}
                other => panic!(
                    "schedule {s} {nemesis:?} (refreshes: {refreshes}, prefix {prefix}): {other}"
                ),
            }
            assert!(
                history.len() >= ops / 2,
                "schedule {s}: too few operations took effect ({})",
                history.len()
            );
        }
    }
}
