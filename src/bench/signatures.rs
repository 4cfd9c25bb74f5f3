//! Signature throughput: what signing costs a write, and how fast a
//! registry can check what peers send — one record at a time (canonical
//! form + Ed25519 verification) and in batches (Ed25519 batch
//! verification over already-canonicalised records).

use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::Value;

use crate::crypto::signature::{served_form, sign_record, signed_bytes, verify_served};
use crate::crypto::{Identity, IdentityChange, NewKey};
use crate::domain::{AgentMetadata, AgentRecord, Envelope};

/// One measured operation.
pub struct Rate {
    pub what: String,
    pub per_second: f64,
    pub micros_each: f64,
}

fn rate(what: impl Into<String>, n: usize, started: Instant) -> Rate {
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    Rate {
        what: what.into(),
        per_second: n as f64 / secs,
        micros_each: secs * 1e6 / n.max(1) as f64,
    }
}

/// Runs every measurement over `n` records of the discovery benchmark's
/// corpus (realistic size: ~1.6 KB of JSON each).
pub fn run(n: usize) -> Result<Vec<Rate>, String> {
    let identity = Identity::apply(
        None,
        &IdentityChange::Establish {
            authority: "bench.example.org".into(),
            keys: vec![NewKey::generate().map_err(|e| e.to_string())?],
            imported: false,
        },
        "2026-01-01T00:00:00Z",
    )
    .map_err(|e| e.to_string())?
    .0
    .ok_or("no identity")?;
    let sources = super::discover::sources();
    let mut records: Vec<AgentRecord> = (0..n)
        .map(|i| {
            let metadata: AgentMetadata =
                serde_json::from_value(super::discover::corpus_agent(&sources, i))
                    .map_err(|e| e.to_string())?;
            Ok(AgentRecord {
                metadata,
                envelope: Envelope {
                    owner: "bench".into(),
                    revision: i as u64 + 1,
                    created_revision: i as u64 + 1,
                    registered_at: "2026-01-01T00:00:00Z".into(),
                    modified_at: "2026-01-01T00:00:00Z".into(),
                    ..Default::default()
                },
            })
        })
        .collect::<Result<_, String>>()?;
    let mut out = Vec::new();

    let signer = identity.signer().ok_or("no signing key")?;
    let started = Instant::now();
    for r in &mut records {
        sign_record(&signer, r, "2026-01-01T00:00:00Z");
    }
    out.push(rate("sign a record (canonical form + Ed25519)", n, started));

    let served: Vec<Value> = records.iter().map(served_form).collect();
    let key = identity.keys[0]
        .verifying_key()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    for s in &served {
        verify_served(s, &key).map_err(|e| e.to_string())?;
    }
    out.push(rate(
        "verify a record (canonical form + Ed25519)",
        n,
        started,
    ));

    let started = Instant::now();
    let bytes: Vec<String> = served
        .iter()
        .map(signed_bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    out.push(rate("canonical form alone", n, started));

    let signatures: Vec<Signature> = records
        .iter()
        .map(|r| {
            let value = r
                .envelope
                .signature
                .as_ref()
                .map(|s| s.value.clone())
                .unwrap_or_default();
            let raw: [u8; 64] = URL_SAFE_NO_PAD
                .decode(value)
                .ok()
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 64]);
            Signature::from_bytes(&raw)
        })
        .collect();
    let started = Instant::now();
    for (b, s) in bytes.iter().zip(&signatures) {
        ed25519_dalek::Verifier::verify(&key, b.as_bytes(), s).map_err(|e| e.to_string())?;
    }
    out.push(rate(
        "Ed25519 verification alone, one at a time",
        n,
        started,
    ));

    for batch in [16usize, 64, 256] {
        let started = Instant::now();
        for (chunk_b, chunk_s) in bytes.chunks(batch).zip(signatures.chunks(batch)) {
            let messages: Vec<&[u8]> = chunk_b.iter().map(|b| b.as_bytes()).collect();
            let keys: Vec<VerifyingKey> = vec![key; chunk_b.len()];
            ed25519_dalek::verify_batch(&messages, chunk_s, &keys).map_err(|e| e.to_string())?;
        }
        out.push(rate(
            format!("Ed25519 batch verification, batches of {batch}"),
            n,
            started,
        ));
    }
    Ok(out)
}

pub fn report(rates: &[Rate], n: usize) -> String {
    let mut s = format!("\nsignatures over {n} corpus records (one core)\n  | operation | per second | µs each |\n  |---|---|---|\n");
    for r in rates {
        s.push_str(&format!(
            "  | {} | {:.0} | {:.1} |\n",
            r.what, r.per_second, r.micros_each
        ));
    }
    s
}
