//! `agentry eval`: retrieval quality of a running registry on a labelled
//! set, measured through its public API (Register, then Discover).
//!
//! Agents file: one JSON object per line, ADP/AIDIP metadata; `examples`
//! may be plain strings (MetaTool's shape) and an agent without bindings
//! gets a placeholder one under `.invalid`. Queries file: one
//! `{"id", "query", "relevant_ids": [...]}` per line.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use futures::{stream, StreamExt};
use serde_json::Value;

use super::{local, CliError, ClientArgs};
use crate::convert::{dataset_agent_json, dataset_id, metadata_from_json};
use crate::pb::{self, discovery_client::DiscoveryClient, registry_client::RegistryClient};

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Agents, JSON lines.
    #[arg(long)]
    pub agents: PathBuf,
    /// Labelled queries, JSON lines.
    #[arg(long)]
    pub queries: PathBuf,
    /// Assume the agents are registered already.
    #[arg(long)]
    pub skip_load: bool,
    /// Also rank by each score component alone (asks for up to 200
    /// candidates with evidence per query and re-sorts them).
    #[arg(long)]
    pub components: bool,
    /// Queries in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Also rank the set with the expert peer (tantivy BM25 + usearch
    /// HNSW, fused by reciprocal rank fusion; `scripts/bench-peers.py`)
    /// on vectors from this machine's default embedding model, and print
    /// its figures beside Agentry's.
    #[arg(long)]
    pub expert: bool,
}

/// Sums of the per-query metrics.
#[derive(Default, Clone, Copy)]
struct Metrics {
    r1: f64,
    r5: f64,
    ndcg10: f64,
    mrr10: f64,
    n: usize,
}

impl Metrics {
    /// Adds one query: `ranked` ids best first, `relevant` the labels
    /// (binary gains, as in the bench-data README).
    fn add(&mut self, ranked: &[&str], relevant: &HashSet<String>) {
        let hits = |k: usize| {
            ranked
                .iter()
                .take(k)
                .filter(|id| relevant.contains(**id))
                .count()
        };
        let r = relevant.len().max(1) as f64;
        self.r1 += hits(1) as f64 / r;
        self.r5 += hits(5) as f64 / r;
        let dcg: f64 = ranked
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, id)| relevant.contains(**id))
            .map(|(i, _)| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let idcg: f64 = (0..relevant.len().min(10))
            .map(|i| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        self.ndcg10 += if idcg > 0.0 { dcg / idcg } else { 0.0 };
        self.mrr10 += ranked
            .iter()
            .take(10)
            .position(|id| relevant.contains(*id))
            .map_or(0.0, |p| 1.0 / (p as f64 + 1.0));
        self.n += 1;
    }

    fn line(&self, name: &str) -> String {
        let n = self.n.max(1) as f64;
        format!(
            "{name:<24} R@1={:.4}  R@5={:.4}  nDCG@10={:.4}  MRR@10={:.4}",
            self.r1 / n,
            self.r5 / n,
            self.ndcg10 / n,
            self.mrr10 / n
        )
    }
}

fn read_lines(path: &PathBuf) -> Result<Vec<Value>, CliError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| local(format!("{}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| local(format!("{}:{}: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// Turns one agents-file line into registrable metadata.
fn agent_metadata(v: Value) -> Result<pb::AgentMetadata, CliError> {
    metadata_from_json(dataset_agent_json(v).map_err(local)?).map_err(local)
}

/// A slow embedder can leave the index behind the load; queries asked
/// before it caught up would be scored against part of the set.
async fn wait_until_indexed(
    c: &crate::cli::ClientArgs,
    mut discovery: DiscoveryClient<tonic::transport::Channel>,
) -> Result<(), CliError> {
    let started = Instant::now();
    loop {
        let req = pb::DiscoverRequest {
            query: "probe".into(),
            limit: 1,
            detail: "minimal".into(),
            ..Default::default()
        };
        let resp = discovery.discover(c.request(req)?).await?.into_inner();
        if !resp.warnings.iter().any(|w| w.contains("catching up")) {
            return Ok(());
        }
        if started.elapsed() > std::time::Duration::from_secs(1800) {
            return Err(local(
                "the registry did not finish indexing within 30 minutes",
            ));
        }
    }
}

/// Runs a call, waiting out the registry's rate limit (429 /
/// RESOURCE_EXHAUSTED) as often as it asks: an evaluation measures the
/// ranker, and a registry that limits its clients must not fail it.
async fn patiently<T, F, Fut>(mut call: F) -> Result<T, CliError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CliError>>,
{
    loop {
        match call().await {
            Err(CliError::Server { code, .. }) if code == "rate_limited" => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

pub async fn run_eval(args: EvalArgs) -> Result<(), CliError> {
    let c = &args.client;
    let (_, channel) = c.connect(0).await?;
    let agents = read_lines(&args.agents)?;
    let queries = read_lines(&args.queries)?;
    let labels = relevant_sets(&queries);
    // Exported before the load consumes the agents.
    let expert_dir = if args.expert {
        Some(export_for_expert(&agents, &queries)?)
    } else {
        None
    };
    if !args.skip_load {
        let started = Instant::now();
        let registry = RegistryClient::new(channel.clone());
        let results: Vec<Result<(), CliError>> = stream::iter(agents)
            .map(|a| {
                let registry = registry.clone();
                async move {
                    let req = pb::RegisterRequest {
                        metadata: Some(agent_metadata(a)?),
                        visibility: 0,
                        readers: Vec::new(),
                    };
                    patiently(|| {
                        let mut registry = registry.clone();
                        let req = c.request(req.clone());
                        async move { registry.register(req?).await.map_err(CliError::from) }
                    })
                    .await?;
                    Ok(())
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let n = results.len();
        results.into_iter().collect::<Result<Vec<_>, _>>()?;
        eprintln!(
            "registered {n} agents in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let limit = if args.components { 200 } else { 10 };
    let discovery = DiscoveryClient::new(channel);
    wait_until_indexed(c, discovery.clone()).await?;
    let started = Instant::now();
    let answers: Vec<Result<(HashSet<String>, pb::DiscoverResponse), CliError>> =
        stream::iter(queries.iter().zip(labels.iter().cloned()))
            .map(|(q, relevant)| {
                let discovery = discovery.clone();
                async move {
                    let text = q
                        .get("query")
                        .and_then(Value::as_str)
                        .ok_or_else(|| local("a query line has no \"query\""))?;
                    let req = pb::DiscoverRequest {
                        query: text.to_string(),
                        limit,
                        include_evidence: args.components,
                        detail: "minimal".into(),
                        ..Default::default()
                    };
                    let resp = patiently(|| {
                        let mut discovery = discovery.clone();
                        let req = c.request(req.clone());
                        async move { discovery.discover(req?).await.map_err(CliError::from) }
                    })
                    .await?
                    .into_inner();
                    Ok((relevant, resp))
                }
            })
            .buffered(args.concurrency.max(1))
            .collect()
            .await;
    let secs = started.elapsed().as_secs_f64();
    let mut fused = Metrics::default();
    let names = ["context", "example", "lexical", "tag"];
    let mut alone = [Metrics::default(); 4];
    let mut warnings = HashSet::new();
    for a in answers {
        let (relevant, resp) = a?;
        warnings.extend(
            resp.warnings
                .iter()
                .filter(|w| !w.starts_with("candidate "))
                .cloned(),
        );
        let ranked: Vec<&str> = resp.candidates.iter().map(|c| c.id.as_str()).collect();
        fused.add(&ranked, &relevant);
        if args.components {
            for (k, name) in names.iter().enumerate() {
                let mut by: Vec<(&str, f64)> = resp
                    .candidates
                    .iter()
                    .map(|c| {
                        (
                            c.id.as_str(),
                            c.score_components.get(*name).copied().unwrap_or(0.0),
                        )
                    })
                    .collect();
                by.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(y.0)));
                let ids: Vec<&str> = by.iter().map(|x| x.0).collect();
                alone[k].add(&ids, &relevant);
            }
        }
    }
    for w in &warnings {
        eprintln!("warning from the registry: {w}");
    }
    println!(
        "{} queries in {secs:.1} s ({:.2} ms each, {} in flight)",
        fused.n,
        secs * 1000.0 / fused.n.max(1) as f64,
        args.concurrency.max(1)
    );
    if args.components {
        for (k, name) in names.iter().enumerate() {
            println!("{}", alone[k].line(&format!("{name} alone")));
        }
    }
    println!("{}", fused.line("fused (as served)"));
    if let Some(dir) = expert_dir {
        let ranked = crate::bench::peers::run(&dir.0, &[1], crate::bench::peers::Mode::Rank)
            .map_err(local)?;
        for line in expert_lines(&ranked, &labels)? {
            println!("{line}");
        }
    }
    Ok(())
}

/// The labels of each query, in the file's order.
fn relevant_sets(queries: &[Value]) -> Vec<HashSet<String>> {
    queries
        .iter()
        .map(|q| {
            q.get("relevant_ids")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(dataset_id))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The folder the expert peer reads, removed however the evaluation ends.
struct ExpertDir(PathBuf);

impl Drop for ExpertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the set for the expert peer (`bench::peers`): the agents as
/// Agentry would store them, their texts and vectors from the default
/// embedding model, and the queries with their vectors.
fn export_for_expert(agents: &[Value], queries: &[Value]) -> Result<ExpertDir, CliError> {
    let config = crate::index::config::DiscoveryConfig::default();
    let embedder = crate::index::embed::Embedder::load(&config)
        .map_err(|e| local(format!("the expert peer needs the embedding model: {e}")))?;
    let dir =
        ExpertDir(std::env::temp_dir().join(format!("agentry-eval-expert-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).map_err(|e| local(format!("{}: {e}", dir.0.display())))?;
    let corpus = agents
        .iter()
        .map(|a| {
            let metadata = serde_json::from_value(dataset_agent_json(a.clone()).map_err(local)?)
                .map_err(|e| local(format!("an agent line: {e}")))?;
            let record = crate::domain::AgentRecord {
                metadata,
                envelope: Default::default(),
            };
            crate::bench::peers::corpus_line(&record, &embedder, Default::default()).map_err(local)
        })
        .collect::<Result<Vec<_>, _>>()?;
    crate::bench::peers::write_lines(&dir.0.join("corpus.jsonl"), corpus).map_err(local)?;
    let lines = queries
        .iter()
        .map(|q| {
            let text = q.get("query").and_then(Value::as_str).unwrap_or_default();
            let id = q.get("id").and_then(Value::as_str);
            crate::bench::peers::query_line(id, text, None, &embedder).map_err(local)
        })
        .collect::<Result<Vec<_>, _>>()?;
    crate::bench::peers::write_lines(&dir.0.join("queries.jsonl"), lines).map_err(local)?;
    Ok(dir)
}

/// The expert peer's figures: each engine alone and fused.
fn expert_lines(ranked: &[Value], relevant: &[HashSet<String>]) -> Result<Vec<String>, CliError> {
    if ranked.len() != relevant.len() {
        return Err(local(format!(
            "the expert peer ranked {} of {} queries",
            ranked.len(),
            relevant.len()
        )));
    }
    let rows = [
        ("bm25", "expert BM25 (tantivy)"),
        ("vector", "expert vector (usearch)"),
        ("fused", "expert RRF"),
        ("fused_tuned", "expert RRF, tuned"),
    ];
    Ok(rows
        .iter()
        .map(|(key, name)| {
            let mut m = Metrics::default();
            for (r, rel) in ranked.iter().zip(relevant) {
                let ids: Vec<&str> = r[key]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                m.add(&ids, rel);
            }
            m.line(name)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_follow_the_bench_data_definitions() {
        let rel: HashSet<String> = ["b".to_string()].into();
        let mut m = Metrics::default();
        m.add(&["a", "b", "c"], &rel);
        assert_eq!(m.r1, 0.0);
        assert_eq!(m.r5, 1.0);
        assert!((m.ndcg10 - 1.0 / 3f64.log2()).abs() < 1e-12);
        assert_eq!(m.mrr10, 0.5);
        let two: HashSet<String> = ["a".to_string(), "z".to_string()].into();
        let mut m = Metrics::default();
        m.add(&["a"], &two);
        assert_eq!(m.r1, 0.5);
    }

    #[test]
    fn bfcl_parameters_become_the_input_schema() {
        let v = serde_json::json!({"id": "f", "name": "f", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
        let shaped = dataset_agent_json(v.clone()).unwrap();
        assert_eq!(shaped["inputs"]["properties"]["city"]["type"], "string");
        assert!(shaped.get("parameters").is_none());
        // And it registers: the schema is valid metadata.
        assert!(agent_metadata(v).unwrap().inputs.is_some());
    }

    #[test]
    fn metatool_lines_become_valid_metadata() {
        let v = serde_json::json!({"id": "ABCmouse", "name": "ABCmouse", "description": "Learning.",
            "examples": ["Suggest an activity"], "long_description": "kept"});
        let m = agent_metadata(v).unwrap();
        assert_eq!(m.examples[0].text, "Suggest an activity");
        assert_eq!(
            m.bindings[0].endpoint,
            "https://ABCmouse.eval.invalid/invoke"
        );
    }
}
