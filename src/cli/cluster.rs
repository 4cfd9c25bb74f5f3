//! `agentry cluster …`: status, bootstrap and membership over the public
//! gRPC `Cluster` service. Any node accepts changes and passes them to the
//! leader, so `--server` may name any member.

use clap::{Args, Subcommand};
use tonic::transport::Channel;

use super::{local, CliError, ClientArgs};
use crate::convert::{cluster_check_to_json, cluster_status_to_json};
use crate::pb::{self, cluster_client::ClusterClient};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, indexes and every member's role, match index and lag.
    Status,
    /// Initialise a new cluster on a node started with --bootstrap manual.
    Init {
        /// Initial voters as id=host:port (Raft addresses); default: the
        /// node itself.
        #[arg(long = "member", value_delimiter = ',')]
        members: Vec<String>,
    },
    /// Add a running, uninitialised node (started with --bootstrap manual)
    /// to the cluster: as a learner, then, once caught up, as a voter.
    Join {
        /// gRPC address of the new node.
        #[arg(long)]
        node: String,
        /// Leave it a learner.
        #[arg(long)]
        learner: bool,
    },
    /// Add a learner by id and Raft address.
    Add {
        id: u64,
        raft_addr: String,
        /// Wait until it has caught up.
        #[arg(long)]
        wait: bool,
    },
    /// Promote a learner to voter.
    Promote { id: u64 },
    /// Remove a voter or learner.
    Remove { id: u64 },
    /// Hand leadership to another voter (before maintenance on the
    /// leader's machine): to ID, or without it to the most caught-up voter.
    /// New writes wait meanwhile; none is lost.
    TransferLeader { id: Option<u64> },
    /// Replica consistency check: every member hashes its replicated state
    /// at one new log entry and the digests are compared. Exits non-zero
    /// unless every member answered with the same digest.
    Check,
}

fn parse_member(m: &str) -> Result<pb::Member, CliError> {
    let (id, addr) = m
        .split_once('=')
        .ok_or_else(|| local(format!("--member '{m}' is not id=host:port")))?;
    Ok(pb::Member {
        id: id
            .trim()
            .parse()
            .map_err(|_| local(format!("--member '{m}': '{id}' is not a node id")))?,
        raft_addr: addr.trim().to_string(),
    })
}

fn print_status(args: &ClientArgs, s: &pb::ClusterStatus) -> Result<(), CliError> {
    let n = s.node.clone().unwrap_or_default();
    if args.json {
        let v = cluster_status_to_json(s);
        out!("{}", serde_json::to_string_pretty(&v).map_err(local)?);
        return Ok(());
    }
    out!(
        "node {} ({}) is {}; cluster {}; term {}; leader {}",
        n.id,
        n.raft_addr,
        n.role,
        if n.cluster_id.is_empty() {
            "not founded yet"
        } else {
            &n.cluster_id
        },
        n.term,
        if s.leader_id == 0 {
            "unknown".to_string()
        } else {
            format!("{} ({})", s.leader_id, s.leader_raft_addr)
        }
    );
    out!(
        "log: last {} committed {} applied {} snapshot {} purged {}; snapshots built {} installed {}{}",
        n.last_log_index,
        n.commit_index,
        n.applied_index,
        n.snapshot_index,
        n.purged_index,
        n.snapshots_built,
        n.snapshots_installed,
        if n.last_snapshot_at.is_empty() {
            String::new()
        } else {
            format!(" (last {})", n.last_snapshot_at)
        }
    );
    out!(
        "{:>4}  {:<28} {:<8} {:<6} {:>10} {:>8}",
        "ID",
        "RAFT ADDRESS",
        "ROLE",
        "LEADER",
        "MATCHED",
        "LAG"
    );
    for m in &s.members {
        let (matched, lag) = if s.replication_known {
            (m.matched_index.to_string(), m.lag.to_string())
        } else {
            ("?".into(), "?".into())
        };
        out!(
            "{:>4}  {:<28} {:<8} {:<6} {:>10} {:>8}",
            m.id,
            m.raft_addr,
            m.role,
            if m.leader { "*" } else { "" },
            matched,
            lag
        );
    }
    for m in s.members.iter().filter(|m| m.unreachable && !m.refused) {
        out!(
            "node {} has not answered the leader for {} s (stopped or cut off); membership changes \
             that would leave no majority of answering voters are refused until it is back or removed",
            m.id,
            crate::consensus::ANSWERED_WITHIN.as_secs()
        );
    }
    for m in s.members.iter().filter(|m| m.refused) {
        out!(
            "node {} is refused: it lost log entries it had acknowledged (its data directory was \
             put back from an older copy); remove it and add it back (agentry cluster remove / add / promote)",
            m.id
        );
    }
    Ok(())
}

/// Prints a consistency check's report; an error unless it is consistent.
fn print_check(args: &ClientArgs, r: &pb::ClusterCheckReport) -> Result<(), CliError> {
    if args.json {
        let v = cluster_check_to_json(r);
        out!("{}", serde_json::to_string_pretty(&v).map_err(local)?);
    } else {
        out!(
            "replica check at log index {} (revision {}): {}",
            r.index,
            r.revision,
            r.outcome
        );
        out!(
            "{:>4}  {:<28} {:<8} {:<10} {:>8}  {}",
            "ID",
            "RAFT ADDRESS",
            "ROLE",
            "STATE",
            "RECORDS",
            "DIGEST (records) / WHY"
        );
        for m in &r.members {
            let records = m.sections.iter().find(|s| s.name == "records");
            let detail = match m.state.as_str() {
                "unanswered" => m.error.clone(),
                "differs" => format!("differs in {}", m.differing.join(", ")),
                _ => records.map_or(String::new(), |s| s.sha256.chars().take(16).collect()),
            };
            out!(
                "{:>4}  {:<28} {:<8} {:<10} {:>8}  {}",
                m.id,
                m.raft_addr,
                m.role,
                m.state,
                records.map_or("-".into(), |s| s.entries.to_string()),
                detail
            );
        }
    }
    match r.outcome.as_str() {
        "consistent" => Ok(()),
        "diverged" => Err(local(
            "members hold state the log does not explain: remove each differing member, empty              its data directory and add it back (docs/operations.md, \"Checking replicas\")",
        )),
        _ => Err(local(
            "not every member could be compared; run the check again once all answer",
        )),
    }
}

async fn client(args: &ClientArgs) -> Result<ClusterClient<Channel>, CliError> {
    Ok(ClusterClient::new(args.connect(0).await?.1))
}

/// Runs a cluster command.
pub async fn run_cluster(all: ClusterArgs) -> Result<(), CliError> {
    let args = &all.client;
    let mut c = client(args).await?;
    let status = match &all.command {
        ClusterCommand::Check => {
            let report = c.check(args.request(pb::ClusterCheckRequest {})?).await?;
            return print_check(args, report.get_ref());
        }
        ClusterCommand::Status => c.status(args.request(pb::ClusterStatusRequest {})?).await?,
        ClusterCommand::Init { members } => {
            let members = members
                .iter()
                .map(|m| parse_member(m))
                .collect::<Result<Vec<_>, _>>()?;
            c.initialize(args.request(pb::InitializeRequest { members })?)
                .await?
        }
        ClusterCommand::Join { node, learner } => {
            let node_args = ClientArgs {
                server: vec![node.clone()],
                api_key: args.api_key.clone(),
                json: args.json,
                ca_file: args.ca_file.clone(),
                client_cert: args.client_cert.clone(),
                client_key: args.client_key.clone(),
            };
            let mut new_node = client(&node_args).await?;
            let info = new_node
                .status(node_args.request(pb::ClusterStatusRequest {})?)
                .await?
                .into_inner()
                .node
                .unwrap_or_default();
            if info.initialized {
                return Err(local(format!(
                    "node {} at {node} already belongs to a cluster",
                    info.id
                )));
            }
            eprintln!(
                "adding node {} ({}) as a learner and waiting for it to catch up",
                info.id, info.raft_addr
            );
            let added = c
                .add_learner(args.request(pb::AddLearnerRequest {
                    id: info.id,
                    raft_addr: info.raft_addr,
                    wait_caught_up: true,
                })?)
                .await?;
            if *learner {
                added
            } else {
                eprintln!("promoting node {} to voter", info.id);
                c.promote(args.request(pb::PromoteRequest { id: info.id })?)
                    .await?
            }
        }
        ClusterCommand::Add {
            id,
            raft_addr,
            wait,
        } => {
            c.add_learner(args.request(pb::AddLearnerRequest {
                id: *id,
                raft_addr: raft_addr.clone(),
                wait_caught_up: *wait,
            })?)
            .await?
        }
        ClusterCommand::Promote { id } => {
            c.promote(args.request(pb::PromoteRequest { id: *id })?)
                .await?
        }
        ClusterCommand::Remove { id } => {
            c.remove(args.request(pb::RemoveRequest { id: *id })?)
                .await?
        }
        ClusterCommand::TransferLeader { id } => {
            if *id == Some(0) {
                return Err(local("node ids start at 1"));
            }
            let msg = pb::TransferLeaderRequest {
                id: id.unwrap_or(0),
            };
            c.transfer_leader(args.request(msg)?).await?
        }
    };
    print_status(args, status.get_ref())
}
