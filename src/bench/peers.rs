//! The peers discovery is measured against (`scripts/bench-peers.py`):
//! what is exported for them and how they are run. `agentry bench
//! discover` times them; `agentry eval --expert` has the expert peer rank
//! a labelled set, so its quality stands beside Agentry's.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::domain::AgentRecord;
use crate::index::embed::Embedder;
use crate::index::search::lexical_text;

/// One corpus line: the text BM25 indexes (the same fields Agentry's
/// lexical index reads) and the expert's one vector per agent, the
/// embedding of that same text — what an engineer would compute with the
/// same model, rather than Agentry's profile vector. `extra` adds members
/// (the tags, LanceDB's vector).
pub fn corpus_line(
    record: &AgentRecord,
    embedder: &Embedder,
    mut extra: serde_json::Map<String, Value>,
) -> Result<Value, String> {
    let text = lexical_text(record);
    let vector = embedder
        .embed_blocking(std::slice::from_ref(&text))
        .map_err(|e| e.to_string())?
        .pop();
    extra.insert("id".into(), json!(record.metadata.id));
    extra.insert("text".into(), json!(text));
    extra.insert("doc_vector".into(), json!(vector));
    Ok(Value::Object(extra))
}

/// One query line: its text, its vector from the same model, and the
/// required tag (if any).
pub fn query_line(
    id: Option<&str>,
    text: &str,
    tag: Option<&str>,
    embedder: &Embedder,
) -> Result<Value, String> {
    let vector = embedder
        .embed_blocking(&[text.to_string()])
        .map_err(|e| e.to_string())?
        .pop();
    Ok(json!({"id": id, "text": text, "tag": tag, "vector": vector}))
}

/// Writes JSON lines to `path`.
pub fn write_lines(path: &Path, lines: impl IntoIterator<Item = Value>) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for line in lines {
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())
}

/// How the peers run: `Time` times the named peers (postgres, lancedb,
/// expert), `Rank` has the expert peer rank the exported queries.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    Time(&'a [String]),
    Rank,
}

/// Runs `scripts/bench-peers.sh` on the corpus exported to `dir`; one
/// JSON object per line back.
pub fn run(dir: &Path, concurrencies: &[usize], mode: Mode<'_>) -> Result<Vec<Value>, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench-peers.sh");
    let clients: Vec<String> = concurrencies.iter().map(|c| c.to_string()).collect();
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(dir)
        .arg(clients.join(","))
        .arg(match mode {
            Mode::Time(peers) => peers.join(","),
            Mode::Rank => "rank".into(),
        })
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}
