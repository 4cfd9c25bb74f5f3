//! The in-memory discovery index and its ranker.
//!
//! Per agent it keeps the facts hard filters need, a BM25 document, a
//! profile vector for candidate generation and one unit vector per ADP
//! example and per AIDIP operation (ADP: keep example vectors separate).
//!
//! Ranking, per request:
//! 1. admit: every hard filter, from indexed facts (no storage reads);
//! 2. candidates: the best admitted agents of the vector index and of the
//!    BM25 term heads, and holders of wanted tags (or every holder of a
//!    selective required tag, or every agent speaking a requested
//!    protocol that few agents speak);
//! 3. first stage: `context` (exact cosine to the profile vector) and
//!    partial BM25 from the term heads, relative to the best candidate's;
//!    the best `pool` go on;
//! 4. re-rank the pool with all components: `lexical` (exact BM25,
//!    relative to the best in the pool), `example` (best single
//!    example or operation), `tag` (preferred and query-derived tags),
//!    `protocol`, `freshness`, and `policy` penalties (deprecated status,
//!    tag stuffing, near-duplicates);
//! 5. evidence for the returned candidates.
//!
//! The profile vector is `normalise(context + λ · mean(example vectors))`:
//! the description says what the agent is, the examples how people ask for
//! it; on MetaTool this mix beats either alone and the concatenated text.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

// How a tag or a unit matched is part of a discovery result's vocabulary,
// so it is defined with the results in `domain`.
pub use crate::domain::discovery::{TagMatch, UnitKind};
use crate::domain::filter::{AgentFacts, FilterKey, HardFilters};
use crate::domain::lease::LeaseTable;
use crate::domain::{AgentRecord, AgentStatus, Principal};

use super::simd::{dot_i8, quantize};
use super::text::{Analyzer, TermList};
use super::vectors::{Prefetching, SavedPartitions, VectorIndex};

/// Ranking weights; the final score is their weighted sum divided by the
/// sum of the weights, plus the (non-positive) policy component.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    pub context: f32,
    pub example: f32,
    pub lexical: f32,
    pub tag: f32,
    pub protocol: f32,
    pub freshness: f32,
    /// λ: how much the mean example vector weighs against the description
    /// in the profile vector.
    pub profile_examples: f32,
    /// Days for the freshness component to fall to one half.
    pub freshness_half_life_days: f32,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            context: 1.0,
            example: 0.1,
            lexical: 0.25,
            tag: 0.3,
            protocol: 0.02,
            freshness: 0.02,
            profile_examples: 2.0,
            freshness_half_life_days: 180.0,
        }
    }
}

/// Agents with more tags than this get their tag component scaled down.
pub const TAG_STUFFING_THRESHOLD: usize = 16;
/// Units (examples + operations) embedded per agent; the rest are indexed
/// for BM25 only, so one record cannot buy unlimited vector matches.
pub const MAX_UNITS: usize = 64;

/// Which filter confined a search to a list of agents ([`Index::confined`]).
#[derive(Debug, PartialEq)]
enum Confined<'f> {
    /// A required tag's holders.
    Tag(&'f String),
    /// The agents with a binding of a requested protocol.
    Protocols,
    /// The agents of the requested AIDIP `publisher`.
    Publisher,
    /// The agents of the requested `owner`.
    Owner,
    /// The agents matching one of an ARD clause's values (`any_of[i]`).
    Clause(usize),
}

/// A fact the index keeps each value's agents of ([`FactLists`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fact {
    Tag,
    Protocol,
    Publisher,
    Owner,
    UrnPublisher,
}

/// The key under which an agent whose id is not an ARD URN is listed
/// among the URN publishers: it has the registry's own publisher, which a
/// request names ([`HardFilters::local_publisher`]).
const LOCAL_URN_PUBLISHER: &str = "";

/// Each value's agents (slots, sorted) of the facts a filter names
/// exactly, so a filter few agents pass is answered from those agents
/// rather than by checking agents one by one until enough pass
/// ([`Index::confined`]).
#[derive(Default)]
struct FactLists {
    tags: FastMap<Arc<str>, Vec<u32>>,
    /// Binding protocols, lowercase.
    protocols: FastMap<Arc<str>, Vec<u32>>,
    publishers: FastMap<Arc<str>, Vec<u32>>,
    owners: FastMap<Arc<str>, Vec<u32>>,
    /// The `<publisher>` of URN ids, lowercase; other ids under
    /// [`LOCAL_URN_PUBLISHER`].
    urn_publishers: FastMap<Arc<str>, Vec<u32>>,
}

impl FactLists {
    fn map(&self, fact: Fact) -> &FastMap<Arc<str>, Vec<u32>> {
        match fact {
            Fact::Tag => &self.tags,
            Fact::Protocol => &self.protocols,
            Fact::Publisher => &self.publishers,
            Fact::Owner => &self.owners,
            Fact::UrnPublisher => &self.urn_publishers,
        }
    }

    fn map_mut(&mut self, fact: Fact) -> &mut FastMap<Arc<str>, Vec<u32>> {
        match fact {
            Fact::Tag => &mut self.tags,
            Fact::Protocol => &mut self.protocols,
            Fact::Publisher => &mut self.publishers,
            Fact::Owner => &mut self.owners,
            Fact::UrnPublisher => &mut self.urn_publishers,
        }
    }

    /// The agents with `key` as `fact` (none: an empty list).
    fn holders(&self, fact: Fact, key: &str) -> &[u32] {
        self.map(fact).get(key).map_or(&[][..], Vec::as_slice)
    }

    /// Every (fact, value) an agent is listed under.
    fn keys(facts: &AgentFacts) -> impl Iterator<Item = (Fact, &str)> {
        let tags = facts.tags.iter().map(|t| (Fact::Tag, &**t));
        let protocols = facts.protocols.iter().map(|p| (Fact::Protocol, &**p));
        let publisher = facts.publisher.iter().map(|p| (Fact::Publisher, &**p));
        let urn = facts
            .urn_publisher
            .as_deref()
            .unwrap_or(LOCAL_URN_PUBLISHER);
        tags.chain(protocols).chain(publisher).chain([
            (Fact::Owner, &*facts.access.owner),
            (Fact::UrnPublisher, urn),
        ])
    }

    /// Moves `slot` from the lists of `old`'s values to those of `new`'s.
    /// A value both have is left alone: an agent re-indexed into the slot
    /// it had (an update) costs nothing for what did not change, where a
    /// value most agents share (an owner) has a list as long as the
    /// directory.
    fn update(&mut self, slot: u32, old: Option<&AgentFacts>, new: Option<&AgentFacts>) {
        let listed = |facts: Option<&AgentFacts>, key: (Fact, &str)| {
            facts.is_some_and(|f| Self::keys(f).any(|k| k == key))
        };
        for key in old.into_iter().flat_map(Self::keys) {
            if !listed(new, key) {
                let lists = self.map_mut(key.0);
                if let Some(list) = lists.get_mut(key.1) {
                    if let Ok(at) = list.binary_search(&slot) {
                        list.remove(at);
                    }
                    if list.is_empty() {
                        lists.remove(key.1);
                    }
                }
            }
        }
        for key in new.into_iter().flat_map(Self::keys) {
            if !listed(old, key) {
                let lists = self.map_mut(key.0);
                match lists.get_mut(key.1) {
                    Some(list) => {
                        let at = list.partition_point(|&x| x < slot);
                        list.insert(at, slot);
                    }
                    None => {
                        lists.insert(key.1.into(), vec![slot]);
                    }
                }
            }
        }
    }

    /// Replaces each listed value of `facts` by the lists' own copy, so
    /// that the agents with a value share one string (a million agents'
    /// tags, protocol, publisher and owner were 128 MB of copies).
    fn intern(&self, facts: &mut AgentFacts) {
        let shared = |map: &FastMap<Arc<str>, Vec<u32>>, value: &mut Arc<str>| {
            if let Some((key, _)) = map.get_key_value(&**value) {
                *value = key.clone();
            }
        };
        // Capabilities are among the tags.
        for t in facts.tags.iter_mut().chain(&mut facts.capabilities) {
            shared(&self.tags, t);
        }
        for p in &mut facts.protocols {
            shared(&self.protocols, p);
        }
        if let Some(p) = &mut facts.publisher {
            shared(&self.publishers, p);
        }
        shared(&self.owners, &mut facts.access.owner);
        if let Some(u) = &mut facts.urn_publisher {
            shared(&self.urn_publishers, u);
        }
    }

    /// Gives back what the lists' growth reserved beyond their length.
    fn compact(&mut self) {
        for fact in [
            Fact::Tag,
            Fact::Protocol,
            Fact::Publisher,
            Fact::Owner,
            Fact::UrnPublisher,
        ] {
            self.map_mut(fact).values_mut().for_each(Vec::shrink_to_fit);
        }
    }
}

/// Agents holding a required tag are all scored when they are at most this
/// many, or no more than a vector-index query would read anyway.
const EXHAUSTIVE_MIN: usize = 4096;
/// Of a required tag's agents, the rows read are those in the partitions
/// nearest the query, enough partitions to hold this many times the pool
/// (if the tag's agents are spread evenly), plus every agent a query term
/// reached; `agentry bench discover` measures the recall this keeps.
pub(crate) const TAG_ROWS_PER_CANDIDATE: usize = 4;
/// The index's maps, read on every request and written for every agent at
/// a rebuild: a fast hasher, seeded per process.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Fewest rows placed before saving the vector partitions again.
const IVF_SAVE_MIN: usize = 4096;
/// Profile cosine above which two candidates count as near-duplicates.
const DUPLICATE_COSINE: f32 = 0.985;
const DEPRECATED_PENALTY: f32 = 0.1;
const DUPLICATE_PENALTY: f32 = 0.15;
/// Hits past the requested limit that are also checked for duplicates (a
/// duplicate pushed down makes room for the next one).
const DUPLICATE_WINDOW: usize = 10;
const STUFFING_PENALTY: f32 = 0.05;

/// A record turned into what the index stores, computed outside the lock.
pub struct Prepared {
    pub id: String,
    pub revision: u64,
    /// None for a deletion.
    pub doc: Option<PreparedDoc>,
}

#[derive(Clone)]
pub struct PreparedDoc {
    facts: AgentFacts,
    terms: TermList,
    /// Analyzed form of each tag, for query-derived tags.
    tag_forms: Vec<(String, String)>,
    profile: Option<Vec<f32>>,
    /// Units (examples, then operations) the record has.
    unit_count: usize,
    /// Vectors of the first units (at most `MAX_UNITS`), in order.
    unit_vectors: Vec<Vec<f32>>,
    /// The vectors as stored earlier, used when there are no f32 ones.
    stored: Option<IndexVectors>,
    indexed_at: String,
    fingerprint: u64,
}

/// A record's vectors as the index keeps them, i8 codes with their scales,
/// in the form they are stored beside the records (so a restart reuses
/// them instead of embedding every record again).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IndexVectors {
    /// What they were computed from ([`vector_source`]): stored vectors
    /// are reused only while it is the same.
    pub source: u64,
    pub profile: Option<(Vec<i8>, f32)>,
    pub units: Vec<(Vec<i8>, f32)>,
}

impl IndexVectors {
    /// `source`, dimension, unit count, then each vector (profile first;
    /// a zero scale for none) as its scale and codes; little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let dim = self
            .profile
            .as_ref()
            .map(|p| p.0.len())
            .or_else(|| self.units.first().map(|u| u.0.len()))
            .unwrap_or(0);
        let mut out = Vec::with_capacity(16 + (1 + self.units.len()) * (4 + dim));
        out.extend(self.source.to_le_bytes());
        out.extend((dim as u32).to_le_bytes());
        out.extend((self.units.len() as u32).to_le_bytes());
        let none = (vec![0i8; dim], 0.0);
        for (code, scale) in
            std::iter::once(self.profile.as_ref().unwrap_or(&none)).chain(&self.units)
        {
            out.extend(scale.to_le_bytes());
            out.extend(code.iter().map(|&c| c as u8));
        }
        out
    }

    /// None for bytes that are not an encoding (they are then recomputed).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let source = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let dim = u32_at(8)? as usize;
        let units = u32_at(12)? as usize;
        if bytes.len() != 16 + (1 + units) * (4 + dim) {
            return None;
        }
        let mut vectors = bytes[16..].chunks_exact(4 + dim).map(|chunk| {
            let scale = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let code: Vec<i8> = chunk[4..].iter().map(|&b| b as i8).collect();
            (code, scale)
        });
        let profile = vectors.next().filter(|p| p.1 != 0.0);
        Some(Self {
            source,
            profile,
            units: vectors.collect(),
        })
    }
}

/// What a record's vectors are computed from: the model, the texts and
/// the profile's λ (FNV-1a, stable across builds).
pub fn vector_source(model: &str, texts: &[String], weights: &Weights) -> u64 {
    let parts = [model.as_bytes(), &weights.profile_examples.to_le_bytes()];
    stable_hash(parts.into_iter().chain(texts.iter().map(String::as_bytes)))
}

/// FNV-1a over the parts, each followed by 0xff: the same in every build
/// and process, for what is stored.
fn stable_hash<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// The key an agent's saved vector partition is kept under.
fn row_key(id: &str) -> u64 {
    stable_hash([id.as_bytes()])
}

impl PreparedDoc {
    /// The same document as indexed at `at` (a pool reuses documents it
    /// prepared for earlier queries).
    pub fn indexed_at(mut self, at: &str) -> Self {
        self.indexed_at = at.to_string();
        self
    }
}

/// One example task or operation. The index keeps only their vectors: a
/// hit names its units by position in [`units_of`], and
/// [`fill_evidence`] takes their texts from the record the response shows.
#[derive(Debug, Clone)]
pub struct Unit {
    pub kind: UnitKind,
    /// Example id, or operation name.
    pub label: Option<String>,
    pub text: String,
}

pub(crate) fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Parameter texts kept per record (the first ones, in schema order).
pub const MAX_PARAMETERS: usize = 32;
/// Characters kept of one parameter's text.
const PARAMETER_CHARS: usize = 512;
/// Nesting followed into object and array parameters.
const PARAMETER_DEPTH: usize = 3;

/// One text per parameter of the record's input schemas (`inputs`, then
/// each operation's): its name, description and allowed values. A
/// request names what it wants done in the words of the arguments it
/// brings ("a large latte with oat milk"), which the description of the
/// tool as a whole often lacks: on BFCL's real requests the parameters
/// lift BM25 from 0.40 to 0.50 nDCG@10 (docs/discovery.md).
pub fn parameter_texts(record: &AgentRecord) -> Vec<String> {
    let m = &record.metadata;
    let mut out = Vec::new();
    let schemas = m
        .inputs
        .iter()
        .chain(m.operations.iter().filter_map(|o| o.inputs.as_ref()));
    for schema in schemas {
        collect_parameters(schema, 0, &mut out);
    }
    out
}

fn collect_parameters(schema: &serde_json::Value, depth: usize, out: &mut Vec<String>) {
    if depth >= PARAMETER_DEPTH {
        return;
    }
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (name, p) in properties {
        if out.len() >= MAX_PARAMETERS {
            return;
        }
        let mut text = name.replace(['_', '.'], " ");
        if let Some(d) = p.get("description").and_then(|d| d.as_str()) {
            text.push_str(": ");
            text.push_str(d);
        }
        if let Some(values) = p.get("enum").and_then(|e| e.as_array()) {
            let values: Vec<String> = values
                .iter()
                .take(16)
                .map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            text.push_str(&format!(" ({})", values.join(", ")));
        }
        out.push(text.chars().take(PARAMETER_CHARS).collect());
        collect_parameters(p, depth + 1, out);
        if let Some(items) = p.get("items") {
            collect_parameters(items, depth + 1, out);
        }
    }
}

/// The texts of a record that get vectors: context first, then units,
/// then parameters (which only feed the profile).
pub fn vector_texts(record: &AgentRecord) -> Vec<String> {
    let m = &record.metadata;
    let mut context = format!("{}\n{}", m.name, m.description);
    let tags: Vec<&str> = m
        .tags
        .iter()
        .chain(&m.capabilities)
        .map(String::as_str)
        .collect();
    if !tags.is_empty() {
        context.push('\n');
        context.push_str(&tags.join(", "));
    }
    let mut out = vec![context];
    out.extend(units_of(record).into_iter().take(MAX_UNITS).map(|u| u.text));
    out.extend(parameter_texts(record));
    out
}

pub fn units_of(record: &AgentRecord) -> Vec<Unit> {
    let m = &record.metadata;
    let examples = m.examples.iter().map(|e| Unit {
        kind: UnitKind::Example,
        label: e.id.clone(),
        text: e.text.clone(),
    });
    let operations = m.operations.iter().map(|o| Unit {
        kind: UnitKind::Operation,
        label: Some(o.name.clone()),
        text: match &o.description {
            Some(d) => format!("{}: {d}", o.name),
            None => o.name.clone(),
        },
    });
    examples.chain(operations).collect()
}

/// The text BM25 indexes for a record: name, description, tags,
/// capabilities, examples, operations and parameters.
pub fn lexical_text(record: &AgentRecord) -> String {
    let m = &record.metadata;
    let mut text = vec![m.name.clone(), m.description.clone()];
    text.extend(m.tags.iter().cloned());
    text.extend(m.capabilities.iter().cloned());
    text.extend(units_of(record).into_iter().map(|u| u.text));
    text.extend(parameter_texts(record));
    text.join("\n")
}

impl Prepared {
    /// The profile vector, for exporting the same vectors to other systems.
    pub fn profile(&self) -> Option<&[f32]> {
        self.doc.as_ref()?.profile.as_deref()
    }
}

/// Prepares a live record; `vectors` are the embeddings of
/// [`vector_texts`] (None without an embedder).
pub fn prepare(
    record: &AgentRecord,
    revision: u64,
    vectors: Option<Vec<Vec<f32>>>,
    analyzer: &Analyzer,
    weights: &Weights,
    indexed_at: &str,
) -> Prepared {
    let mut p = analyse(record, revision, analyzer, indexed_at);
    if let Some(doc) = p.doc.as_mut() {
        doc.attach_vectors(vectors, weights);
    }
    p
}

/// [`prepare`] without the vectors: the words, units and facts of a record
/// (the part a federated pool keeps between queries).
pub fn analyse(
    record: &AgentRecord,
    revision: u64,
    analyzer: &Analyzer,
    indexed_at: &str,
) -> Prepared {
    let m = &record.metadata;
    // An agent whose status is `deleted` is indexed like any other: the
    // default filters leave it out, and a search that asks for that status
    // ranks it. A tombstone is no agent.
    if record.envelope.deleted {
        return Prepared {
            id: m.id.clone(),
            revision,
            doc: None,
        };
    }
    let unit_count = m.examples.len() + m.operations.len();
    let terms = analyzer.term_list(&lexical_text(record));
    let facts = AgentFacts::of(record);
    let tag_forms = facts
        .tags
        .iter()
        .map(|t| (t.to_string(), analyzer.terms(t).join(" ")))
        .collect();
    Prepared {
        id: m.id.clone(),
        revision,
        doc: Some(PreparedDoc {
            fingerprint: fingerprint(&m.name, &m.description),
            facts,
            terms,
            tag_forms,
            profile: None,
            unit_count,
            unit_vectors: Vec::new(),
            stored: None,
            indexed_at: indexed_at.to_string(),
        }),
    }
}

impl PreparedDoc {
    /// Sets the vectors from stored ones (instead of embedding).
    pub fn attach_stored(&mut self, vectors: IndexVectors) {
        self.stored = Some(vectors);
    }

    /// The vectors in the form they are stored, computed from `source`
    /// ([`vector_source`]); None without vectors.
    pub fn index_vectors(&self, source: u64) -> Option<IndexVectors> {
        if let Some(stored) = &self.stored {
            return Some(stored.clone());
        }
        Some(IndexVectors {
            source,
            profile: Some(quantize(self.profile.as_ref()?)),
            units: self.unit_vectors.iter().map(|v| quantize(v)).collect(),
        })
    }

    /// Sets the profile and unit vectors from the vectors of
    /// [`vector_texts`] (context first, then the units, then the
    /// parameters), if there are any. The profile adds the mean of the
    /// units' and parameters' vectors; only units are matched one by one
    /// (the `example` component and `matched_examples`).
    pub fn attach_vectors(&mut self, vectors: Option<Vec<Vec<f32>>>, weights: &Weights) {
        let Some(mut vs) = vectors else {
            return;
        };
        let mut units_v = vs.split_off(1.min(vs.len()));
        let parameters_v = units_v.split_off(self.unit_count.min(MAX_UNITS).min(units_v.len()));
        if let Some(mut p) = vs.pop() {
            let parts = units_v.len() + parameters_v.len();
            if parts > 0 {
                let w = weights.profile_examples / parts as f32;
                for u in units_v.iter().chain(&parameters_v) {
                    p.iter_mut().zip(u).for_each(|(x, y)| *x += w * y);
                }
            }
            normalise(&mut p);
            self.profile = Some(p);
        }
        self.unit_vectors = units_v;
    }
}

/// What the index keeps of an agent: what filters and ranking read on
/// every request. Texts shown only for the returned hits (units, the
/// description) are read from the stored record instead, which keeps a
/// million agents in a few GiB.
struct Doc {
    /// The same string as its key in [`Index::by_id`].
    id: Arc<str>,
    revision: u64,
    facts: AgentFacts,
    /// i8 unit vectors, in the order of [`units_of`].
    unit_vectors: UnitCodes,
    /// Shared by the documents indexed at the same moment (a rebuild's).
    indexed_at: std::sync::Arc<str>,
    /// Of the name and description (see [`fingerprint`]).
    fingerprint: u64,
    /// False when the embedder failed for this record: it is found by
    /// words and tags only until it is indexed again.
    has_profile: bool,
    /// The agent's lease hold as [`LeaseTable::cell`] encodes it, read
    /// with the document instead of looked up by name. Written under the
    /// read lock by the lease table's applies ([`Index::set_hold`]), after
    /// the table changed: a search sees the hold an apply leaves at the
    /// latest when the apply is acknowledged.
    hold: AtomicU64,
}

/// A document's unit vectors as i8 codes in one block (one allocation and
/// one sequential read per agent when it is re-ranked). Boxed slices, not
/// `Vec`s: exactly their length. Collected from the stored units on a
/// restart, the codes' `Vec` had grown by doubling to 2,048 bytes for five
/// units' 1,280, nearly a fifth of a node's memory at a million agents.
struct UnitCodes {
    codes: Box<[i8]>,
    scales: Box<[f32]>,
    /// The largest length of a unit as coded (its codes' norm times its
    /// scale): with the query's, an upper bound of every unit's score
    /// (Cauchy–Schwarz), so re-ranking skips the units of an agent that
    /// could not reach the head even with its best possible example.
    longest: f32,
}

impl UnitCodes {
    fn new(vectors: &[Vec<f32>]) -> Self {
        let mut codes = Vec::with_capacity(vectors.iter().map(Vec::len).sum());
        let mut scales = Vec::with_capacity(vectors.len());
        for v in vectors {
            let (c, scale) = quantize(v);
            codes.extend(c);
            scales.push(scale);
        }
        Self::from_parts(codes, scales)
    }

    fn of_codes(units: &[(Vec<i8>, f32)]) -> Self {
        Self::from_parts(
            units.iter().flat_map(|u| u.0.iter().copied()).collect(),
            units.iter().map(|u| u.1).collect(),
        )
    }

    fn from_parts(codes: Vec<i8>, scales: Vec<f32>) -> Self {
        let dim = codes.len().checked_div(scales.len()).unwrap_or(0).max(1);
        let longest = codes
            .chunks_exact(dim)
            .zip(&scales)
            .map(|(row, s)| code_length(row) * s)
            .fold(0.0f32, f32::max);
        Self {
            codes: codes.into(),
            scales: scales.into(),
            longest,
        }
    }

    /// At least the score of every unit for a query whose code has
    /// [`code_length`] times scale `query_length`.
    fn bound(&self, query_length: f32) -> f32 {
        // A hair above the product: the scores are f32 sums of i32 dots.
        self.longest * query_length * (1.0 + 1e-5)
    }

    /// Calls `visit(i, score)` with the approximate cosine of the query
    /// `code` to each unit `i`, in order.
    fn each_score(&self, code: &(Vec<i8>, f32), mut visit: impl FnMut(usize, f32)) {
        super::simd::each_dot_i8(&code.0, &self.codes, |i, dot| {
            visit(i, dot as f32 * code.1 * self.scales[i]);
        });
    }

    /// The best unit score for the query `code` (None without units).
    fn best(&self, code: &(Vec<i8>, f32)) -> Option<f32> {
        let mut best: Option<f32> = None;
        // Compared as `hit` compares them (`total_cmp`), so the `example`
        // a member was ranked by is the one it reports.
        self.each_score(code, |_, s| {
            best = Some(best.map_or(s, |b| std::cmp::max_by(b, s, f32::total_cmp)));
        });
        best
    }
}

#[cfg(test)]
thread_local! {
    /// Set by tests to score every pool member's units (no pruning), and
    /// counting the members whose units were scored.
    static SCORE_EVERY_UNIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static UNITS_SCORED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The Euclidean length of an i8 code.
fn code_length(code: &[i8]) -> f32 {
    (dot_i8(code, code) as f32).sqrt()
}

/// How big the index is.
pub struct Size {
    pub agents: usize,
    pub terms: usize,
    pub postings: usize,
    pub vector_bytes: usize,
    /// Agents indexed without vectors although a model is loaded.
    pub without_vectors: usize,
}

/// See [`Index::tag_recall`].
pub struct TagRecall {
    /// None: every row of the tag read.
    pub rows_per_candidate: Option<usize>,
    pub read_share: f64,
    pub recall: f64,
    pub scan_us: f64,
    pub pool: usize,
}

/// Candidates re-ranked with every component for a request of `limit`.
fn pool_size(limit: usize) -> usize {
    (limit * 5).max(100)
}

/// The index. Slots are reused; a slot's profile row lives at
/// `slot * dim` of `profiles`.
pub struct Index {
    docs: Vec<Option<Doc>>,
    /// Each slot's [`row_key`], for saving the vector partitions: read from
    /// the documents' ids, a save at 300,000 agents held the index for
    /// 40 ms (an id is a pointer to follow per row); from here, a few.
    row_keys: Vec<u64>,
    free: Vec<u32>,
    by_id: FastMap<Arc<str>, u32>,
    lexical: super::lexical::LexicalIndex,
    /// Tag, protocol, publisher, ... → slots.
    lists: FactLists,
    /// Analyzed tag form → tags with that form (for query-derived tags).
    tag_forms: FastMap<String, Vec<String>>,
    vectors: VectorIndex,
    analyzer: Analyzer,
    /// Revision of the last change applied.
    pub revision: u64,
    /// Agents without a profile vector although vectors are kept.
    without_vectors: usize,
    /// The last `indexed_at`, shared with the next document of that time.
    indexed_at: std::sync::Arc<str>,
    /// Saved vector partitions a rebuild places its rows by, until
    /// [`Self::maintain`].
    saved_partitions: Option<SavedPartitions>,
}

/// One ranked agent, with everything a response may show.
#[derive(Debug, Clone)]
pub struct Hit {
    pub id: String,
    pub score: f32,
    /// (name, value), in ADP's order.
    pub components: Vec<(&'static str, f32)>,
    pub matched_tags: Vec<(String, TagMatch)>,
    /// (unit, score), best first; only those that matched well. Filled
    /// from the record by [`fill_evidence`].
    pub matched_units: Vec<(Unit, f32)>,
    /// Filled from the record by [`fill_evidence`].
    pub snippet: Option<String>,
    /// The matched units as positions in [`units_of`] with their scores;
    /// None when the request asked for no evidence.
    pub matched_positions: Option<Vec<(usize, f32)>>,
    /// The revision of the record that was ranked.
    pub revision: u64,
    pub indexed_at: String,
    pub status: AgentStatus,
    pub expired: bool,
    /// The expiry the agent's lease gives it, when it holds one.
    pub lease_expires_unix: Option<i64>,
    pub duplicate_of: Option<String>,
    pub notes: Vec<String>,
}

/// A ranking request, already validated.
#[derive(Clone)]
pub struct Query<'a> {
    pub text: &'a str,
    /// Filled in by the index handle from its embedder.
    pub vector: Option<Vec<f32>>,
    pub filters: &'a HardFilters,
    pub preferred_tags: &'a [String],
    pub limit: usize,
    pub evidence: bool,
    pub principal: Option<&'a Principal>,
    pub now_unix: i64,
    /// Agents' holds (`domain::lease`); set by the index handle.
    pub leases: Option<&'a LeaseTable>,
}

impl Query<'_> {
    /// The expiry a lease gives the agent, overriding its `expires_at`.
    fn lease_expiry(&self, d: &Doc) -> Option<i64> {
        match d.hold.load(Ordering::Relaxed) {
            0 => None,
            cell => self.leases.and_then(|l| l.cell_expiry(cell)),
        }
    }

    /// The agent's expiry as discovery goes by: its lease's, else its own.
    fn expires_unix(&self, d: &Doc) -> Option<i64> {
        self.lease_expiry(d).or(d.facts.expires_unix)
    }
}

/// What re-ranking needs of the request, shared by every pool member.
struct Rescoring<'a> {
    q: &'a Query<'a>,
    w: &'a Weights,
    wanted_tags: &'a [(String, TagMatch)],
    total_weight: f32,
    query_i8: Option<&'a (Vec<i8>, f32)>,
    /// The query code's length times its scale (see [`UnitCodes::bound`]).
    query_length: f32,
}

impl Rescoring<'_> {
    /// The final score of a member whose other components weigh `rest`
    /// and whose best unit scores `example`. The head of the pool and the
    /// hits both score through here, so a member's score is the same
    /// number wherever it is computed.
    fn score(&self, rest: f32, example: Option<f32>, policy: f32) -> f32 {
        (rest + self.w.example * example.unwrap_or(0.0)) / self.total_weight.max(f32::EPSILON)
            + policy
    }
}

/// Score components besides `context` and `lexical` (already in
/// [`Scored`]), and the final score.
struct Components {
    tag: f32,
    example: Option<f32>,
    protocol: f32,
    freshness: f32,
    policy: f32,
    score: f32,
    /// The weighted sum of every component but `example`: the score with
    /// another example is [`Rescoring::score`] of it.
    rest: f32,
    /// The agent's tag count when it is over the stuffing threshold.
    stuffed_tags: Option<usize>,
    deprecated: bool,
}

/// A member of the head of the pool in its final place: its score (with
/// any duplicate penalty), slot, position in the pool, and the slot of the
/// better agent it nearly repeats.
struct Placed {
    score: f32,
    slot: u32,
    at: usize,
    duplicate_of: Option<u32>,
}

struct Scored {
    slot: u32,
    context: Option<f32>,
    lexical: f32,
    first: f32,
}

impl Index {
    pub fn new(dim: usize) -> Self {
        Self {
            docs: Vec::new(),
            row_keys: Vec::new(),
            free: Vec::new(),
            by_id: FastMap::default(),
            lexical: Default::default(),
            lists: FactLists::default(),
            tag_forms: FastMap::default(),
            vectors: VectorIndex::new(dim),
            analyzer: Analyzer::default(),
            revision: 0,
            without_vectors: 0,
            indexed_at: std::sync::Arc::from(""),
            saved_partitions: None,
        }
    }

    /// Places the rows of this (empty) index by the partitions saved from
    /// an earlier one, until [`Self::maintain`].
    pub fn adopt_partitions(&mut self, saved: SavedPartitions) {
        self.vectors.adopt(&saved);
        self.saved_partitions = Some(saved);
    }

    /// The vector partitions to save, when partitioned (see
    /// [`VectorIndex::saved`]).
    pub fn saved_partitions(&self) -> Option<Vec<u8>> {
        self.vectors.saved(&self.row_keys)
    }

    /// Saving the partitions again is due once a tenth of the rows (and at
    /// least 4,096) were placed since the last save, or after training.
    pub fn partitions_save_due(&self) -> bool {
        self.vectors.partitions() > 0
            && self.vectors.placed_since_saved() >= (self.vectors.live() / 10).max(IVF_SAVE_MIN)
    }

    /// Notes the partitions of `generation` (read with their encoding)
    /// saved.
    pub fn mark_partitions_saved(&mut self, generation: u64) {
        self.vectors.mark_saved(generation);
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Applies one prepared change. Changes older than what the index holds
    /// for the agent are ignored, so replaying history over a newer scan
    /// never goes back in time.
    pub fn apply(&mut self, p: Prepared) {
        if p.revision > self.revision {
            self.revision = p.revision;
        }
        let replaced = match self.by_id.get(p.id.as_str()) {
            Some(&slot) => {
                let current = self.docs[slot as usize].as_ref().map_or(0, |d| d.revision);
                if p.revision < current {
                    return;
                }
                self.remove(slot).map(|facts| (slot, facts))
            }
            None => None,
        };
        let Some(doc) = p.doc else {
            if let Some((slot, facts)) = replaced {
                self.lists.update(slot, Some(&facts), None);
            }
            return;
        };
        let slot = self.free.pop().unwrap_or(self.docs.len() as u32);
        let s = slot as usize;
        if s == self.docs.len() {
            self.docs.push(None);
            self.row_keys.push(0);
        }
        let key = row_key(&p.id);
        self.row_keys[s] = key;
        self.lexical.insert(slot, doc.terms.iter());
        // The slot just freed is the one taken again, so an update moves
        // only the values that changed.
        let kept = match replaced {
            Some((old, facts)) if old == slot => Some(facts),
            Some((old, facts)) => {
                self.lists.update(old, Some(&facts), None);
                None
            }
            None => None,
        };
        self.lists.update(slot, kept.as_ref(), Some(&doc.facts));
        let mut facts = doc.facts;
        self.lists.intern(&mut facts);
        for (tag, form) in doc.tag_forms {
            let tags = self.tag_forms.entry(form).or_default();
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
        let stored = doc.stored.unwrap_or_default();
        let hint = self
            .saved_partitions
            .as_ref()
            .and_then(|saved| saved.list_of(key));
        let has_profile = match (&doc.profile, &stored.profile) {
            (Some(p), _) => {
                self.vectors.set(slot, p, hint);
                true
            }
            (None, Some((code, scale))) => {
                self.vectors.set_code(slot, code, *scale, hint);
                true
            }
            (None, None) => false,
        };
        let unit_vectors = if doc.unit_vectors.is_empty() {
            UnitCodes::of_codes(&stored.units)
        } else {
            UnitCodes::new(&doc.unit_vectors)
        };
        let id: Arc<str> = p.id.into();
        self.by_id.insert(id.clone(), slot);
        if *self.indexed_at != *doc.indexed_at {
            self.indexed_at = std::sync::Arc::from(doc.indexed_at.as_str());
        }
        self.docs[s] = Some(Doc {
            id,
            revision: p.revision,
            facts,
            unit_vectors,
            indexed_at: self.indexed_at.clone(),
            fingerprint: doc.fingerprint,
            has_profile,
            hold: AtomicU64::new(0),
        });
        if !has_profile && self.vectors.dim() > 0 {
            self.without_vectors += 1;
        }
    }

    /// Sets agent `id`'s hold cell ([`LeaseTable::cell`]); nothing when
    /// it is not indexed (indexing it reads the table then).
    pub fn set_hold(&self, id: &str, cell: u64) {
        if let Some(d) = self
            .by_id
            .get(id)
            .and_then(|&slot| self.docs.get(slot as usize))
            .and_then(Option::as_ref)
        {
            d.hold.store(cell, Ordering::Relaxed);
        }
    }

    /// Sets every agent's hold cell from `table`.
    pub fn set_all_holds(&self, table: &LeaseTable) {
        for d in self.docs.iter().flatten() {
            d.hold.store(table.cell(&d.id), Ordering::Relaxed);
        }
    }

    /// Frees `slot`; its agent's facts are returned, still in
    /// [`Self::lists`] for the caller to move ([`FactLists::update`]).
    fn remove(&mut self, slot: u32) -> Option<AgentFacts> {
        let s = slot as usize;
        let doc = self.docs[s].take()?;
        self.by_id.remove(&*doc.id);
        self.lexical.remove(slot);
        self.vectors.clear(slot);
        if !doc.has_profile && self.vectors.dim() > 0 {
            self.without_vectors -= 1;
        }
        self.free.push(slot);
        Some(doc.facts)
    }

    /// The smallest set of agents a filter confines the answer to, when
    /// it has at most `rows` agents (sorted by slot, built only when small
    /// enough): a required tag's holders, the agents with a binding of one
    /// of the requested protocols, the requested publisher's or owner's
    /// agents, or those matching an ARD clause on tags or URN publisher.
    fn confined<'s, 'f>(
        &'s self,
        filters: &'f HardFilters,
        rows: usize,
    ) -> Option<(Confined<'f>, std::borrow::Cow<'s, [u32]>)> {
        let lists = &self.lists;
        // Several lists are a union, counted before it is merged: agents
        // in two of them count twice, so the bound errs towards not
        // merging. On a tie the earlier filter confines.
        let mut best: Option<(Confined<'f>, Vec<&'s [u32]>, usize)> = None;
        let mut consider = |by: Confined<'f>, union: Vec<&'s [u32]>| {
            let n = union.iter().map(|l| l.len()).sum::<usize>();
            if best.as_ref().is_none_or(|(_, _, least)| n < *least) {
                best = Some((by, union, n));
            }
        };
        for t in &filters.required_tags {
            consider(Confined::Tag(t), vec![lists.holders(Fact::Tag, t)]);
        }
        if !filters.protocols.is_empty() {
            let union = filters
                .protocols
                .iter()
                .map(|p| lists.holders(Fact::Protocol, p))
                .collect();
            consider(Confined::Protocols, union);
        }
        if let Some(p) = &filters.publisher {
            consider(Confined::Publisher, vec![lists.holders(Fact::Publisher, p)]);
        }
        if let Some(o) = &filters.owner {
            consider(Confined::Owner, vec![lists.holders(Fact::Owner, o)]);
        }
        for (i, clause) in filters.any_of.iter().enumerate() {
            let union = match clause.key {
                FilterKey::Tags => clause
                    .values
                    .iter()
                    .map(|v| lists.holders(Fact::Tag, v))
                    .collect(),
                FilterKey::UrnPublisher => {
                    let local = filters.local_publisher.as_deref().is_some_and(|local| {
                        clause.values.iter().any(|v| v.eq_ignore_ascii_case(local))
                    });
                    // The registry's own agents are listed under a key no
                    // URN publisher has; a value equal to it names none.
                    clause
                        .values
                        .iter()
                        .filter(|v| v.as_str() != LOCAL_URN_PUBLISHER)
                        .map(|v| lists.holders(Fact::UrnPublisher, &v.to_ascii_lowercase()))
                        .chain(
                            local.then(|| lists.holders(Fact::UrnPublisher, LOCAL_URN_PUBLISHER)),
                        )
                        .collect()
                }
                _ => continue,
            };
            consider(Confined::Clause(i), union);
        }
        let (by, union, _) = best.filter(|(_, _, n)| *n <= rows)?;
        let mut nonempty = union.into_iter().filter(|l| !l.is_empty());
        // One list (the usual request) is used as it is, already sorted;
        // several are merged.
        let list = match (nonempty.next(), nonempty.next()) {
            (None, _) => Vec::new().into(),
            (Some(only), None) => only.into(),
            (Some(a), Some(b)) => {
                let mut merged: Vec<u32> = [a, b]
                    .into_iter()
                    .chain(nonempty)
                    .flatten()
                    .copied()
                    .collect();
                merged.sort_unstable();
                merged.dedup();
                merged.into()
            }
        };
        Some((by, list))
    }

    /// Whether the filters admit no agent at all, known from the lists
    /// alone (a tag, protocol, publisher or owner nobody has): the query
    /// then needs no vector.
    pub fn admits_none(&self, filters: &HardFilters) -> bool {
        self.confined(filters, 0).is_some()
    }

    /// Tags of the index that the query text names (by analyzed form,
    /// single words up to three-word phrases).
    fn query_tags(&self, terms: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut phrase = String::new();
        for n in 1..=3 {
            for w in terms.windows(n) {
                phrase.clear();
                for (i, word) in w.iter().enumerate() {
                    if i > 0 {
                        phrase.push(' ');
                    }
                    phrase.push_str(word);
                }
                if let Some(tags) = self.tag_forms.get(phrase.as_str()) {
                    for t in tags {
                        if self.lists.tags.contains_key(t.as_str()) && !out.contains(t) {
                            out.push(t.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// Ranks the admitted agents for `q`.
    pub fn search(&self, weights: &Weights, q: &Query) -> Vec<Hit> {
        // When a required tag, or another filter naming agents exactly, is
        // held by few enough agents, those agents are the candidates; when
        // by none, the answer is empty before the query is analysed.
        let scan_rows = self.vectors.tag_scan_rows().max(EXHAUSTIVE_MIN);
        let confined = self.confined(q.filters, scan_rows);
        if confined.as_ref().is_some_and(|(_, list)| list.is_empty()) {
            return Vec::new();
        }
        let terms = self.analyzer.terms(q.text);
        let dim = self.vectors.dim();
        let semantic = q.vector.as_deref().filter(|v| dim > 0 && v.len() == dim);
        let pool = pool_size(q.limit);
        let admits = |filters: &HardFilters, slot: u32| {
            self.docs[slot as usize].as_ref().is_some_and(|d| {
                filters.admit_expiring(&d.facts, || q.expires_unix(d), q.principal, q.now_unix)
            })
        };
        let admit = |slot: u32| admits(q.filters, slot);
        // What the filters read of an agent, asked for a few agents ahead.
        let doc_ahead = |slot: u32| {
            if let Some(entry) = self.docs.get(slot as usize) {
                super::simd::prefetch(std::slice::from_ref(entry));
            }
        };
        let query_tags = self.query_tags(&terms);
        let wanted_tags: Vec<(String, TagMatch)> = q
            .preferred_tags
            .iter()
            .map(|t| (t.clone(), TagMatch::Direct))
            .chain(
                query_tags
                    .iter()
                    .filter(|t| !q.preferred_tags.contains(t))
                    .map(|t| (t.clone(), TagMatch::Expanded)),
            )
            .collect();
        let lexical = self.lexical.query(&terms);
        let heads = lexical.accumulate();

        // Candidates. The agents a filter confines the answer to are
        // scanned (filter first, exact); otherwise the vector index, BM25
        // and the wanted tags each contribute their best admitted agents.
        let query_i8 = semantic.map(quantize);
        let mut cands: Vec<u32> = match confined {
            Some((confined, list)) => {
                let list = &list[..];
                // Every agent of the list passes the filter that made it:
                // the filters need not check it again (a string read per
                // agent).
                let mut rest = q.filters.clone();
                match confined {
                    Confined::Tag(tag) => rest.required_tags.retain(|t| t != tag),
                    Confined::Protocols => rest.protocols.clear(),
                    Confined::Publisher => rest.publisher = None,
                    Confined::Owner => rest.owner = None,
                    Confined::Clause(i) => {
                        rest.any_of.remove(i);
                    }
                }
                // Scored by the i8 rows and the term heads first, so only
                // the head of the list pays for the filters.
                let best = list.iter().map(|&s| heads.get(s)).fold(0.0f32, f32::max);
                // The best admitted of the rows read for `want` (see
                // [`VectorIndex::approx_near`]), and whether every row was.
                let scan = |want: usize| {
                    let context = match &query_i8 {
                        Some(code) => self.vectors.approx_near(list, code, want),
                        None => vec![Some(0.0); list.len()],
                    };
                    let whole = context.iter().all(Option::is_some);
                    let scored: Vec<(f32, u32)> = list
                        .iter()
                        .zip(context)
                        .filter_map(|(&s, context)| {
                            let partial = heads.get(s);
                            let lexical = if best > 0.0 { partial / best } else { 0.0 };
                            // A row not read counts only if a term reached it.
                            let context = match (context, &query_i8) {
                                (Some(c), _) => c,
                                (None, Some(code)) if partial > 0.0 => self.vectors.approx(s, code),
                                (None, _) => return None,
                            };
                            Some((weights.context * context + weights.lexical * lexical, s))
                        })
                        .collect();
                    let picked = super::vectors::best_admitted(
                        scored,
                        pool,
                        Prefetching(|slot| admits(&rest, slot), doc_ahead),
                    );
                    (picked, whole)
                };
                let (mut picked, whole) = scan(TAG_ROWS_PER_CANDIDATE * pool);
                if picked.len() < pool && !whole {
                    // The other filters admitted too few of the rows read:
                    // every holder is read, so none that passes is missed.
                    picked = scan(usize::MAX).0;
                }
                picked.into_iter().map(|(s, _)| s).collect()
            }
            None => {
                let mut c = Vec::new();
                if let (Some(v), Some(code)) = (semantic, &query_i8) {
                    c.extend(
                        self.vectors
                            .top(v, code, pool, Prefetching(admit, doc_ahead))
                            .into_iter()
                            .map(|(s, _)| s),
                    );
                }
                c.extend(
                    super::vectors::best_admitted(
                        heads.touched().collect(),
                        pool,
                        Prefetching(admit, doc_ahead),
                    )
                    .into_iter()
                    .map(|(s, _)| s),
                );
                for (t, _) in &wanted_tags {
                    if let Some(list) = self.lists.tags.get(t.as_str()) {
                        c.extend(list.iter().copied().filter(|&s| admit(s)).take(pool));
                    }
                }
                c
            }
        };
        cands.sort_unstable();
        cands.dedup();
        if semantic.is_none() {
            // Without vectors, an agent nothing in the query matched is no
            // candidate at all (it could only be listed in id order).
            cands.retain(|&s| {
                heads.get(s) > 0.0
                    || (!lexical.is_empty() && lexical.score(s) > 0.0)
                    || wanted_tags.iter().any(|(t, _)| {
                        self.docs[s as usize]
                            .as_ref()
                            .is_some_and(|d| d.facts.has_tag(t))
                    })
            });
        }
        if cands.is_empty() {
            return Vec::new();
        }
        // First stage: lexical is the partial score from the term heads,
        // relative to the best candidate's.
        let best_partial = cands.iter().map(|&s| heads.get(s)).fold(0.0f32, f32::max);
        let mut first: Vec<Scored> = cands
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                self.vectors.prefetch_ahead(&cands, i);
                let context = semantic
                    .filter(|_| self.vectors.has(slot))
                    .map(|v| self.vectors.exact(slot, v));
                let lexical = if best_partial > 0.0 {
                    heads.get(slot) / best_partial
                } else {
                    0.0
                };
                Scored {
                    slot,
                    context,
                    lexical,
                    first: weights.context * context.unwrap_or(0.0) + weights.lexical * lexical,
                }
            })
            .collect();
        if first.len() > pool {
            first.select_nth_unstable_by(pool, |a, b| b.first.total_cmp(&a.first));
            first.truncate(pool);
        }
        // Re-ranking: exact BM25, relative to the best in the pool.
        let slots: Vec<u32> = first.iter().map(|s| s.slot).collect();
        let exact = lexical.scores(&slots, &heads);
        let best_exact = exact.iter().copied().fold(0.0f32, f32::max);
        for (s, e) in first.iter_mut().zip(exact) {
            s.lexical = if best_exact > 0.0 {
                e / best_exact
            } else {
                0.0
            };
        }
        let total_weight = weights.context
            + weights.example
            + weights.lexical
            + weights.tag
            + weights.protocol
            + weights.freshness;
        let ctx = Rescoring {
            q,
            w: weights,
            wanted_tags: &wanted_tags,
            total_weight,
            query_i8: query_i8.as_ref(),
            query_length: query_i8
                .as_ref()
                .map_or(0.0, |(code, scale)| code_length(code) * scale),
        };
        // Duplicates are looked for among a few more than are returned,
        // by score alone; only the returned members become hits (a hit
        // scores every unit and copies its strings).
        let mut head: Vec<Placed> = self
            .head_of_pool(&first, &ctx, q.limit + DUPLICATE_WINDOW)
            .into_iter()
            .map(|(score, slot, at)| Placed {
                score,
                slot,
                at,
                duplicate_of: None,
            })
            .collect();
        self.mark_duplicates(&mut head);
        head.truncate(q.limit);
        head.iter()
            .filter_map(|p| {
                let d = self.docs[p.slot as usize].as_ref()?;
                let mut h = self.hit(d, &first[p.at], &ctx);
                // The hit scores the member exactly as the pool's head did
                // (checked in unit tests: the crate is built without debug
                // assertions).
                #[cfg(test)]
                assert!(p.duplicate_of.is_some() || h.score.to_bits() == p.score.to_bits());
                if let Some(original) = p.duplicate_of {
                    let original = self.docs[original as usize].as_ref()?.id.to_string();
                    h.score = p.score;
                    if let Some(c) = h.components.iter_mut().find(|c| c.0 == "policy") {
                        c.1 -= DUPLICATE_PENALTY;
                    }
                    h.notes.push(format!("near-duplicate of '{original}'"));
                    h.duplicate_of = Some(original);
                }
                if !q.evidence {
                    h.matched_positions = None;
                }
                Some(h)
            })
            .collect()
    }

    /// The `keep` best-scored pool members, best first (ties by id), as
    /// (score, slot, position in `pool`). Every member is scored without
    /// its units first; the units, the costly part, are scored only for a
    /// member whose best possible example could still lift it into the
    /// head. The result is the same as scoring every member in full.
    fn head_of_pool(
        &self,
        pool: &[Scored],
        ctx: &Rescoring,
        keep: usize,
    ) -> Vec<(f32, u32, usize)> {
        // Weights are configurable, negative ones included: an example
        // moves the score by at most this times its best unit's score.
        let per_example = (ctx.w.example / ctx.total_weight.max(f32::EPSILON)).abs();
        // Members are scattered in memory: each is asked for a few ahead.
        const AHEAD: usize = 4;
        let doc = |i: usize| {
            pool.get(i)
                .and_then(|s| self.docs.get(s.slot as usize))
                .and_then(Option::as_ref)
        };
        // (the best score the member could reach, its position, its
        // components without units)
        let mut reachable: Vec<(f32, usize, Components)> = pool
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                if let Some(ahead) = pool.get(i + AHEAD) {
                    if let Some(entry) = self.docs.get(ahead.slot as usize) {
                        super::simd::prefetch(std::slice::from_ref(entry));
                    }
                }
                let d = self.docs[s.slot as usize].as_ref()?;
                let base = self.components(d, s, ctx, None);
                let units = &d.unit_vectors;
                let reach = if ctx.query_i8.is_some() && !units.scales.is_empty() {
                    // Slack for the float rounding of the weighted sum.
                    per_example * units.bound(ctx.query_length).max(0.0) + 1e-5
                } else {
                    0.0
                };
                Some((base.score + reach, i, base))
            })
            .collect();
        reachable.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        let mut order: Vec<(f32, u32, usize)> = Vec::with_capacity(keep * 2);
        // The `keep` best scores so far, best first.
        let mut best: Vec<f32> = Vec::with_capacity(keep + 1);
        #[cfg(test)]
        let prune = !SCORE_EVERY_UNIT.get();
        #[cfg(not(test))]
        let prune = true;
        for (k, &(reach, i, ref base)) in reachable.iter().enumerate() {
            if prune && best.len() >= keep && best.last().is_some_and(|&floor| reach < floor) {
                break;
            }
            if let Some(ahead) = reachable.get(k + 2).and_then(|r| doc(r.1)) {
                super::simd::prefetch(&ahead.unit_vectors.codes);
            }
            let s = &pool[i];
            let Some(d) = self.docs[s.slot as usize].as_ref() else {
                continue;
            };
            let score = if reach > base.score {
                #[cfg(test)]
                UNITS_SCORED.set(UNITS_SCORED.get() + 1);
                ctx.score(base.rest, self.best_unit(d, ctx), base.policy)
            } else {
                base.score
            };
            order.push((score, s.slot, i));
            best.insert(best.partition_point(|&b| b >= score), score);
            best.truncate(keep);
        }
        order.sort_by(|a, b| self.ranked((a.0, a.1), (b.0, b.1)));
        order.truncate(keep);
        order
    }

    /// The best unit score of an agent for the query (None without units
    /// or without a query vector).
    fn best_unit(&self, d: &Doc, ctx: &Rescoring) -> Option<f32> {
        ctx.query_i8.and_then(|code| d.unit_vectors.best(code))
    }

    /// The score components of one pool member, given its best unit score.
    fn components(&self, d: &Doc, s: &Scored, ctx: &Rescoring, example: Option<f32>) -> Components {
        let (q, w) = (ctx.q, ctx.w);
        let tag_hits = ctx
            .wanted_tags
            .iter()
            .filter(|(t, _)| d.facts.has_tag(t))
            .count();
        let mut policy = 0.0f32;
        let mut tag = if ctx.wanted_tags.is_empty() {
            0.0
        } else {
            tag_hits as f32 / ctx.wanted_tags.len() as f32
        };
        let n_tags = d.facts.tags.len();
        let stuffed_tags = (n_tags > TAG_STUFFING_THRESHOLD).then_some(n_tags);
        if stuffed_tags.is_some() {
            tag *= TAG_STUFFING_THRESHOLD as f32 / n_tags as f32;
            policy -= STUFFING_PENALTY;
        }
        let deprecated = d.facts.status == AgentStatus::Deprecated;
        if deprecated {
            policy -= DEPRECATED_PENALTY;
        }
        let protocol = if q.filters.protocols.is_empty() {
            1.0
        } else {
            // Earlier protocols in the request are preferred.
            q.filters
                .protocols
                .iter()
                .position(|p| d.facts.protocols.iter().any(|x| **x == **p))
                .map_or(0.0, |i| 1.0 / (1.0 + i as f32))
        };
        let age_days = (q.now_unix - d.facts.updated_unix).max(0) as f32 / 86_400.0;
        let freshness = 0.5f32.powf(age_days / w.freshness_half_life_days.max(1.0));
        let rest = w.context * s.context.unwrap_or(0.0)
            + w.lexical * s.lexical
            + w.tag * tag
            + w.protocol * protocol
            + w.freshness * freshness;
        Components {
            tag,
            example,
            protocol,
            freshness,
            policy,
            score: ctx.score(rest, example, policy),
            rest,
            stuffed_tags,
            deprecated,
        }
    }

    /// A ranked agent with its components and evidence.
    fn hit(&self, d: &Doc, s: &Scored, ctx: &Rescoring) -> Hit {
        // Each unit's score, once: the best is the `example` component, and
        // those close to it are evidence.
        let unit_scores = ctx.query_i8.map(|code| {
            let mut scores = Vec::with_capacity(d.unit_vectors.scales.len());
            d.unit_vectors.each_score(code, |_, s| scores.push(s));
            scores
        });
        let best_unit = unit_scores
            .as_ref()
            .and_then(|u| u.iter().copied().max_by(f32::total_cmp));
        let c = self.components(d, s, ctx, best_unit);
        let q = ctx.q;
        // Every requested or query-derived tag the agent has; required tags
        // are matched by every candidate and shown as such.
        let mut matched_tags: Vec<(String, TagMatch)> = q
            .filters
            .required_tags
            .iter()
            .map(|t| (t.clone(), TagMatch::Direct))
            .collect();
        for (t, how) in ctx.wanted_tags {
            if d.facts.has_tag(t) && !matched_tags.iter().any(|(m, _)| m == t) {
                matched_tags.push((t.clone(), *how));
            }
        }
        let mut notes = Vec::new();
        if let Some(n_tags) = c.stuffed_tags {
            notes.push(format!(
                "tag stuffing: {n_tags} tags (more than {TAG_STUFFING_THRESHOLD}); tag matches down-weighted"
            ));
        }
        if c.deprecated {
            notes.push("deprecated".into());
        }
        let mut components = Vec::with_capacity(7);
        components.push(("tag", c.tag));
        if let Some(context) = s.context {
            components.push(("context", context));
        }
        if let Some(e) = c.example {
            components.push(("example", e));
        }
        components.push(("protocol", c.protocol));
        components.push(("freshness", c.freshness));
        components.push(("policy", c.policy));
        components.push(("lexical", s.lexical));
        // Examples close to the best one are evidence; far worse ones are not.
        let matched_positions = match (c.example, unit_scores) {
            (Some(best), Some(units)) => {
                let mut scores: Vec<(usize, f32)> = units.into_iter().enumerate().collect();
                scores.sort_by(|a, b| b.1.total_cmp(&a.1));
                scores
                    .into_iter()
                    .take_while(|(_, sc)| *sc >= best - 0.1)
                    .take(3)
                    .collect()
            }
            _ => Vec::new(),
        };
        Hit {
            id: d.id.to_string(),
            score: c.score,
            components,
            matched_tags,
            matched_units: Vec::new(),
            snippet: None,
            matched_positions: Some(matched_positions),
            revision: d.revision,
            indexed_at: d.indexed_at.to_string(),
            status: d.facts.status,
            expired: q.expires_unix(d).is_some_and(|t| t <= q.now_unix),
            lease_expires_unix: q.lease_expiry(d),
            duplicate_of: None,
            notes,
        }
    }

    /// A member that nearly repeats a better one (same name and
    /// description, or nearly the same profile vector) is pushed down and
    /// remembers whose copy it is.
    fn mark_duplicates(&self, head: &mut [Placed]) {
        let mut changed = false;
        for i in 1..head.len() {
            let Some(di) = self.docs[head[i].slot as usize].as_ref() else {
                continue;
            };
            for j in 0..i {
                if head[j].duplicate_of.is_some() {
                    continue;
                }
                let Some(dj) = self.docs[head[j].slot as usize].as_ref() else {
                    continue;
                };
                let same_text = di.fingerprint == dj.fingerprint;
                if same_text || self.vectors.cosine(head[i].slot, head[j].slot) > DUPLICATE_COSINE {
                    head[i].score -= DUPLICATE_PENALTY;
                    head[i].duplicate_of = Some(head[j].slot);
                    changed = true;
                    break;
                }
            }
        }
        if changed {
            head.sort_by(|a, b| self.ranked((a.score, a.slot), (b.score, b.slot)));
        }
    }

    /// The order of an answer, for (score, slot) pairs: best score first;
    /// equal scores in id order, so rankings are stable.
    fn ranked(&self, a: (f32, u32), b: (f32, u32)) -> std::cmp::Ordering {
        let id = |slot: u32| self.docs[slot as usize].as_ref().map(|d| &*d.id);
        b.0.total_cmp(&a.0).then_with(|| id(a.1).cmp(&id(b.1)))
    }

    /// Begins retraining the vector partitions beside the index when it is
    /// due (see [`super::vectors::Retraining`]).
    pub(crate) fn begin_vector_retraining(&mut self) -> Option<super::vectors::Retraining> {
        self.vectors.begin_retraining()
    }

    /// The vector index, for a retraining to copy its rows from.
    pub(crate) fn vectors(&self) -> &super::vectors::VectorIndex {
        &self.vectors
    }

    /// See [`super::vectors::VectorIndex::install_retrained`].
    pub(crate) fn install_retrained(
        &mut self,
        r: super::vectors::Retraining,
    ) -> Option<super::vectors::VectorIndex> {
        self.vectors.install_retrained(r)
    }

    /// See [`super::vectors::VectorIndex::take_changed`].
    pub(crate) fn take_retraining_changes(&mut self, id: u64) -> Option<super::vectors::Changed> {
        self.vectors.take_changed(id)
    }

    pub(crate) fn abandon_retraining(&mut self, id: u64) {
        self.vectors.abandon_retraining(id);
    }

    /// Upkeep after a batch of changes (vector partitions retrained when
    /// the collection has doubled; rows held back by adopted partitions
    /// assigned).
    pub fn maintain(&mut self) {
        self.vectors.maintain();
        self.saved_partitions = None;
    }

    /// Gives back what the growth of its lists reserved beyond their
    /// length (a quarter of them on average): after a rebuild, which then
    /// holds the whole directory in the least memory.
    pub fn compact(&mut self) {
        super::simd::on_huge_pages(&mut self.docs);
        self.row_keys.shrink_to_fit();
        self.lists.compact();
        self.lexical.compact();
        self.vectors.compact();
    }

    /// See [`VectorIndex::recall`]; `k` = `limit`, pool as a search with
    /// it; the truth is the cosine to each agent's vector in `exact`.
    pub fn vector_recall(
        &self,
        queries: &[Vec<f32>],
        limit: usize,
        exact: &HashMap<String, Vec<f32>>,
    ) -> Vec<super::vectors::ProbeRecall> {
        let by_slot: Vec<Option<&Vec<f32>>> = self
            .docs
            .iter()
            .map(|d| d.as_ref().and_then(|d| exact.get(&*d.id)))
            .collect();
        let truth = |slot: u32, q: &[f32]| {
            let v = by_slot.get(slot as usize).copied().flatten()?;
            Some(super::simd::dot_f32(q, v))
        };
        self.vectors.recall(queries, limit, pool_size(limit), truth)
    }

    /// How well a required tag's scan (see [`TAG_ROWS_PER_CANDIDATE`])
    /// finds the tag's true nearest agents, for the benchmark: for `(query,
    /// tag)` pairs, the share of the tag's `limit` nearest by the cosine to
    /// each agent's vector in `exact` that are among the `pool` best rows
    /// read, at half, once and twice the rows per candidate and with every
    /// row read; with the share of the tag's rows read and the scan's mean
    /// time. Term matches, which are always read, are left out.
    pub fn tag_recall(
        &self,
        queries: &[(Vec<f32>, String)],
        limit: usize,
        exact: &HashMap<String, Vec<f32>>,
    ) -> Vec<TagRecall> {
        let pool = pool_size(limit);
        let cosine = |slot: u32, q: &[f32]| {
            let d = self.docs.get(slot as usize)?.as_ref()?;
            Some(super::simd::dot_f32(q, exact.get(&*d.id)?))
        };
        let lists: Vec<(&Vec<f32>, &[u32], Vec<u32>)> = queries
            .iter()
            .filter_map(|(q, tag)| {
                let list = self.lists.tags.get(tag.as_str())?.as_slice();
                let scored = list
                    .iter()
                    .filter_map(|&s| Some((cosine(s, q)?, s)))
                    .collect();
                let truth = super::vectors::best_admitted(scored, limit, |_| true)
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                Some((q, list, truth))
            })
            .collect();
        [
            Some(TAG_ROWS_PER_CANDIDATE / 2),
            Some(TAG_ROWS_PER_CANDIDATE),
            Some(TAG_ROWS_PER_CANDIDATE * 2),
            None,
        ]
        .into_iter()
        .map(|per| {
            let want = per.map_or(usize::MAX, |p| p * pool);
            let (mut found, mut wanted, mut read, mut rows) = (0usize, 0usize, 0usize, 0usize);
            let started = std::time::Instant::now();
            for (q, list, truth) in &lists {
                let near = self.vectors.approx_near(list, &quantize(q), want);
                let scored: Vec<(f32, u32)> = list
                    .iter()
                    .zip(near)
                    .filter_map(|(&s, c)| Some((c?, s)))
                    .collect();
                read += scored.len();
                rows += list.len();
                let got = super::vectors::best_admitted(scored, pool, |_| true);
                found += super::vectors::found_in(truth, &got);
                wanted += truth.len();
            }
            TagRecall {
                rows_per_candidate: per,
                read_share: read as f64 / rows.max(1) as f64,
                recall: found as f64 / wanted.max(1) as f64,
                scan_us: started.elapsed().as_secs_f64() * 1e6 / lists.len().max(1) as f64,
                pool,
            }
        })
        .collect()
    }

    /// Whether a retraining of the vector partitions may begin: due, and
    /// none running.
    pub fn vectors_training_due(&self) -> bool {
        self.vectors.retraining_due()
    }

    /// Partitions of the vector index (0 while every row is scanned).
    pub fn partitions(&self) -> usize {
        self.vectors.partitions()
    }

    /// (agents, distinct terms, postings, bytes of vectors), for metrics.
    pub fn size_without_vectors(&self) -> usize {
        self.without_vectors
    }

    pub fn size(&self) -> Size {
        let (terms, postings) = self.lexical.size();
        let unit_bytes: usize = self
            .docs
            .iter()
            .flatten()
            .map(|d| d.unit_vectors.codes.len() + d.unit_vectors.scales.len() * 4)
            .sum();
        Size {
            agents: self.len(),
            terms,
            postings,
            vector_bytes: self.vectors.bytes() + unit_bytes,
            without_vectors: self.without_vectors,
        }
    }
}

/// What tells two agents with the same name and description apart from
/// the rest: a hash of both, trimmed and lowercase.
fn fingerprint(name: &str, description: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.trim().to_lowercase().hash(&mut h);
    description.trim().to_lowercase().hash(&mut h);
    h.finish()
}

/// Fills a hit's evidence from the record it ranks: the matched units'
/// texts and labels, and the description's sentence closest to the query.
/// `same_record` says the record is the revision that was ranked; when a
/// write landed in between, its units may no longer be the ones that
/// scored, so none are shown (the snippet is taken from what is shown).
pub fn fill_evidence(
    hit: &mut Hit,
    record: &AgentRecord,
    query: &str,
    analyzer: &Analyzer,
    same_record: bool,
) {
    let Some(positions) = hit.matched_positions.take() else {
        return;
    };
    if same_record {
        let units = units_of(record);
        hit.matched_units = positions
            .into_iter()
            .filter_map(|(i, score)| units.get(i).map(|u| (u.clone(), score)))
            .collect();
    }
    hit.snippet = snippet(
        &record.metadata.description,
        &analyzer.terms(query),
        analyzer,
    );
}

/// The sentence of the description that shares most terms with the query
/// (the first one when none does), cut to 240 characters.
fn snippet(description: &str, query_terms: &[String], analyzer: &Analyzer) -> Option<String> {
    let sentences: Vec<&str> = description
        .split_inclusive(['.', '!', '?', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let best = sentences
        .iter()
        .enumerate()
        .max_by_key(|(i, s)| {
            let hits = analyzer
                .terms(s)
                .iter()
                .filter(|t| query_terms.contains(t))
                .count();
            (hits, std::cmp::Reverse(*i))
        })
        .map(|(_, s)| *s)?;
    let cut: String = best.chars().take(240).collect();
    Some(if cut.len() < best.len() {
        format!("{cut}…")
    } else {
        cut
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::AnyOf;
    use serde_json::json;

    fn record(metadata: serde_json::Value) -> AgentRecord {
        AgentRecord {
            metadata: serde_json::from_value(metadata).unwrap(),
            envelope: Default::default(),
        }
    }

    /// A drink-ordering function in BFCL's shape, as `inputs`.
    fn change_drink() -> AgentRecord {
        record(json!({
            "id": "drinks", "name": "ChaDri.change_drink", "description": "Modifies a drink order.",
            "examples": [{"text": "make my coffee bigger"}],
            "inputs": {"type": "object", "properties": {
                "drink_id": {"type": "string", "description": "The drink to change."},
                "new_preferences": {"type": "object", "properties": {
                    "size": {"type": "string", "enum": ["small", "large"]},
                    "milk_type": {"type": "string", "description": "Kind of milk."}
                }}
            }},
            "operations": [{"name": "cancel", "inputs": {"properties": {"reason": {}}}}]
        }))
    }

    /// Dimensions of the stub embedder.
    const DIM: usize = 64;
    /// 2026-11-26T00:00:00Z.
    const NOW: i64 = 1_795_651_200;

    /// A stub embedder: every analysed word is a fixed pseudo-random
    /// direction, a text the normalised sum of its words' directions, so
    /// cosine follows shared words and the tests need no model.
    fn stub(text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; DIM];
        for word in Analyzer::default().terms(text) {
            let mut seed = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            for x in v.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *x += (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
        }
        normalise(&mut v);
        v
    }

    fn index_of(records: &[AgentRecord]) -> Index {
        let mut index = Index::new(DIM);
        for (i, r) in records.iter().enumerate() {
            let vectors = vector_texts(r).iter().map(|t| stub(t)).collect();
            let weights = Weights::default();
            let at = "2026-11-26T00:00:00Z";
            index.apply(prepare(
                r,
                i as u64 + 1,
                Some(vectors),
                &Analyzer::default(),
                &weights,
                at,
            ));
        }
        index
    }

    fn agent(id: &str, description: &str, extra: serde_json::Value) -> AgentRecord {
        let mut m = json!({"id": id, "name": id, "description": description,
            "updated_at": "2026-11-20T00:00:00Z"});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
            m.extend(extra.clone());
        }
        record(m)
    }

    fn ask(index: &Index, text: &str, filters: &HardFilters, preferred: &[String]) -> Vec<Hit> {
        ask_up_to(index, text, filters, preferred, 10)
    }

    fn ask_up_to(
        index: &Index,
        text: &str,
        filters: &HardFilters,
        preferred: &[String],
        limit: usize,
    ) -> Vec<Hit> {
        let q = Query {
            text,
            vector: Some(stub(text)),
            filters,
            preferred_tags: preferred,
            limit,
            evidence: true,
            principal: None,
            now_unix: NOW,
            leases: None,
        };
        index.search(&Weights::default(), &q)
    }

    /// 5,000 agents, partitioned, each described by two of `words` and
    /// tagged by `tags_of(i)`.
    fn partitioned(words: &[&str], tags_of: impl Fn(usize) -> serde_json::Value) -> Index {
        let n = words.len();
        let records: Vec<AgentRecord> = (0..5000)
            .map(|i| {
                agent(
                    &format!("a{i}"),
                    &format!("{} {} agent {i}", words[i % n], words[(i / n) % n]),
                    json!({"tags": tags_of(i)}),
                )
            })
            .collect();
        let mut index = index_of(&records);
        index.maintain();
        assert!(index.partitions() > 0);
        index
    }

    fn component(h: &Hit, name: &str) -> Option<f32> {
        h.components.iter().find(|c| c.0 == name).map(|c| c.1)
    }

    fn weather_agents() -> Vec<AgentRecord> {
        vec![
            agent(
                "forecast",
                "Weather forecast for any city, hour by hour.",
                json!({"examples": [{"text": "will it rain in Paris tomorrow"}], "tags": ["weather"]}),
            ),
            agent(
                "farm",
                "Weather forecast for farms and crops.",
                json!({"status": "deprecated"}),
            ),
            agent(
                "stocks",
                "Stock prices and market news.",
                json!({"tags": ["finance"]}),
            ),
            agent(
                "tags",
                "Weather alerts for storms.",
                json!({"tags":
                (0..20).map(|i| if i == 0 { "weather".to_string() } else { format!("t{i}") }).collect::<Vec<_>>()}),
            ),
        ]
    }

    #[test]
    fn the_score_is_the_weighted_mean_of_the_reported_components_plus_policy() {
        let index = index_of(&weather_agents());
        let hits = ask(
            &index,
            "weather forecast for my city",
            &HardFilters::default(),
            &[],
        );
        assert!(hits.len() >= 3, "{hits:?}");
        let w = Weights::default();
        let total = w.context + w.example + w.lexical + w.tag + w.protocol + w.freshness;
        for h in &hits {
            let c = |n| component(h, n).unwrap_or(0.0);
            let weighted = w.context * c("context")
                + w.example * c("example")
                + w.lexical * c("lexical")
                + w.tag * c("tag")
                + w.protocol * c("protocol")
                + w.freshness * c("freshness");
            let expected = weighted / total + c("policy");
            assert!((h.score - expected).abs() < 1e-5, "{h:?}");
        }
        assert!(hits.windows(2).all(|p| p[0].score >= p[1].score));
        assert_eq!(hits[0].id, "forecast");
    }

    #[test]
    fn deprecation_and_tag_stuffing_cost_their_penalties_and_say_so() {
        let index = index_of(&weather_agents());
        let wanted = ["weather".to_string()];
        let hits = ask(&index, "weather forecast", &HardFilters::default(), &wanted);
        let find = |id: &str| {
            hits.iter()
                .find(|h| h.id == id)
                .unwrap_or_else(|| panic!("{id}: {hits:?}"))
        };
        let farm = find("farm");
        assert_eq!(component(farm, "policy"), Some(-DEPRECATED_PENALTY));
        assert!(farm.notes.iter().any(|n| n == "deprecated"));
        // 20 tags: the tag match counts 16/20, and the agent pays.
        let stuffed = find("tags");
        assert_eq!(component(stuffed, "tag"), Some(16.0 / 20.0));
        assert_eq!(component(stuffed, "policy"), Some(-STUFFING_PENALTY));
        assert!(stuffed.notes.iter().any(|n| n.starts_with("tag stuffing")));
        // An honest agent with the tag gets all of it and no penalty.
        let forecast = find("forecast");
        assert_eq!(component(forecast, "tag"), Some(1.0));
        assert_eq!(component(forecast, "policy"), Some(0.0));
    }

    #[test]
    fn a_near_duplicate_is_pushed_down_and_names_its_original() {
        let copy = |id: &str| {
            agent(
                id,
                "Translate text between languages.",
                json!({"name": "Translator"}),
            )
        };
        let index = index_of(&[
            copy("original"),
            copy("copy"),
            agent("other", "Translate speech.", json!({})),
        ]);
        let hits = ask(&index, "translate text", &HardFilters::default(), &[]);
        let dup = hits
            .iter()
            .find(|h| h.duplicate_of.is_some())
            .expect("a duplicate");
        let first = hits
            .iter()
            .position(|h| h.duplicate_of.is_none() && h.id != "other")
            .unwrap();
        assert_eq!(dup.duplicate_of.as_deref(), Some(hits[first].id.as_str()));
        assert_eq!(component(dup, "policy"), Some(-DUPLICATE_PENALTY));
        let at = hits.iter().position(|h| h.duplicate_of.is_some()).unwrap();
        assert!(at > first);
    }

    #[test]
    fn a_required_tags_scan_misses_no_agent_the_other_filters_admit() {
        // A partitioned index of 5,000 agents where 4,000 hold the required
        // tag (few enough to be scanned by the tag's list), and a second
        // filter admits only 31 of those, scattered: the partitions nearest
        // the query hold only a few of them, so the scan must read the
        // rest of the tag's rows too.
        let words = [
            "forecast",
            "invoice",
            "translate",
            "summarise",
            "schedule",
            "route",
        ];
        let kept = |i: usize| i < 4000 && i.is_multiple_of(133);
        let index = partitioned(&words, |i| match (i < 4000, kept(i)) {
            (true, true) => json!(["t"]),
            (true, false) => json!(["t", "other"]),
            _ => json!(["other"]),
        });
        let filters = HardFilters {
            required_tags: vec!["t".into()],
            excluded_tags: vec!["other".into()],
            ..Default::default()
        };
        let hits = ask_up_to(&index, "plan a delivery", &filters, &[], 50);
        assert_eq!(hits.len(), 31, "every admitted agent is found");
        assert!(hits.iter().all(|h| h.id[1..].parse().is_ok_and(kept)));
    }

    #[test]
    fn a_protocol_few_agents_speak_is_answered_from_its_speakers() {
        // 5,000 partitioned agents; 37 of them, scattered, also have an
        // A2A binding. Asking for A2A finds every one of them (the query's
        // words reach none in particular), and asking for a protocol no
        // agent speaks answers with nothing.
        let words = ["forecast", "invoice", "translate", "summarise", "schedule"];
        let speaks = |i: usize| i % 135 == 7;
        let records: Vec<AgentRecord> = (0..5000)
            .map(|i| {
                let mut bindings =
                    vec![json!({"protocol": "https", "endpoint": "https://a.example/x"})];
                if speaks(i) {
                    bindings.push(json!({"protocol": "a2a", "endpoint": "https://a.example/a2a"}));
                }
                // A few of the A2A speakers also speak gRPC.
                if i % 270 == 7 {
                    bindings.push(json!({"protocol": "grpc", "endpoint": "https://a.example/g"}));
                }
                agent(
                    &format!("a{i}"),
                    &format!("{} {} agent {i}", words[i % 5], words[(i / 5) % 5]),
                    json!({"bindings": bindings}),
                )
            })
            .collect();
        let mut index = index_of(&records);
        index.maintain();
        assert!(index.partitions() > 0);
        let only = |protocols: &[&str]| HardFilters {
            protocols: protocols.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        };
        assert!(matches!(
            index.confined(&only(&["a2a"]), EXHAUSTIVE_MIN),
            Some((Confined::Protocols, list)) if list.len() == 37
        ));
        let hits = ask_up_to(&index, "plan a delivery", &only(&["a2a"]), &[], 50);
        assert_eq!(hits.len(), 37, "every agent speaking A2A is found");
        assert!(hits.iter().all(|h| h.id[1..].parse().is_ok_and(speaks)));
        // Two protocols whose agents overlap: their agents once each, in
        // slot order.
        match index.confined(&only(&["a2a", "grpc"]), EXHAUSTIVE_MIN) {
            Some((Confined::Protocols, list)) => {
                assert_eq!(list.len(), 37);
                assert!(list.windows(2).all(|w| w[0] < w[1]));
            }
            _ => panic!("two rare protocols confine the search"),
        }
        // Both protocols: every agent speaks one, too many to scan.
        assert!(index
            .confined(&only(&["a2a", "https"]), EXHAUSTIVE_MIN)
            .is_none());
        assert_eq!(
            ask_up_to(&index, "plan a delivery", &only(&["a2a", "https"]), &[], 50).len(),
            50
        );
        assert!(matches!(
            index.confined(&only(&["mcp"]), EXHAUSTIVE_MIN),
            Some((Confined::Protocols, list)) if list.is_empty()
        ));
        assert!(ask(&index, "plan a delivery", &only(&["mcp"]), &[]).is_empty());
        // Removing a speaker takes it out of the protocol's list.
        index.apply(Prepared {
            id: "a7".into(),
            revision: 5001,
            doc: None,
        });
        let hits = ask_up_to(&index, "plan a delivery", &only(&["a2a"]), &[], 50);
        assert_eq!(hits.len(), 36);
        assert!(hits.iter().all(|h| h.id != "a7"));
    }

    #[test]
    fn a_publisher_owner_or_urn_publisher_few_agents_have_confines_the_search() {
        // 5,000 partitioned agents: 40 of them, scattered, are Acme's
        // (publisher, owner and URN publisher), the rest Globex's; 25
        // have ids that are no URN and count as this registry's own.
        let words = ["forecast", "invoice", "translate", "summarise", "schedule"];
        let acme = |i: usize| i % 125 == 3;
        let local = |i: usize| i % 200 == 11;
        let records: Vec<AgentRecord> = (0..5000)
            .map(|i| {
                let org = if acme(i) { "acme" } else { "globex" };
                let id = if local(i) {
                    format!("a{i}")
                } else {
                    format!("urn:air:{org}.example:tools:a{i}")
                };
                let mut r = agent(
                    &id,
                    &format!("{} {} agent {i}", words[i % 5], words[(i / 5) % 5]),
                    json!({"publisher": org}),
                );
                r.envelope.owner = org.into();
                r
            })
            .collect();
        let mut index = index_of(&records);
        index.maintain();
        assert!(index.partitions() > 0);
        let n_of = |i: &str| -> usize {
            i.rsplit(['a', ':'])
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(usize::MAX)
        };
        let found = |index: &Index, f: &HardFilters| -> Vec<usize> {
            let mut ns: Vec<usize> = ask_up_to(index, "plan a delivery", f, &[], 100)
                .iter()
                .map(|h| n_of(&h.id))
                .collect();
            ns.sort_unstable();
            ns
        };
        let acme_agents: Vec<usize> = (0..5000).filter(|&i| acme(i)).collect();
        let publisher = HardFilters {
            publisher: Some("acme".into()),
            ..Default::default()
        };
        assert!(matches!(
            index.confined(&publisher, EXHAUSTIVE_MIN),
            Some((Confined::Publisher, list)) if list.len() == 40
        ));
        assert_eq!(found(&index, &publisher), acme_agents);
        let owner = HardFilters {
            owner: Some("acme".into()),
            ..Default::default()
        };
        assert!(matches!(
            index.confined(&owner, EXHAUSTIVE_MIN),
            Some((Confined::Owner, list)) if list.len() == 40
        ));
        assert_eq!(found(&index, &owner), acme_agents);
        // ARD's publisher: by URN, plus the registry's own agents when the
        // request names this registry's authority.
        let urn = |values: &[&str]| HardFilters {
            any_of: vec![AnyOf {
                key: FilterKey::UrnPublisher,
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
            local_publisher: Some("registry.example".into()),
            ..Default::default()
        };
        let acme_by_urn: Vec<usize> = (0..5000).filter(|&i| acme(i) && !local(i)).collect();
        assert!(matches!(
            index.confined(&urn(&["acme.example"]), EXHAUSTIVE_MIN),
            Some((Confined::Clause(0), list)) if list.len() == acme_by_urn.len()
        ));
        assert_eq!(found(&index, &urn(&["ACME.example"])), acme_by_urn);
        let mine: Vec<usize> = (0..5000)
            .filter(|&i| local(i) || (acme(i) && !local(i)))
            .collect();
        assert_eq!(
            found(&index, &urn(&["acme.example", "registry.example"])),
            mine
        );
        // A value no URN publisher can have names no agent, not the
        // registry's own (listed under the empty key).
        assert!(found(&index, &urn(&[""])).is_empty());
        // Nobody's: known from the lists, without a vector.
        let nobody = HardFilters {
            publisher: Some("initech".into()),
            ..Default::default()
        };
        assert!(index.admits_none(&nobody));
        assert!(!index.admits_none(&publisher));
        assert!(found(&index, &nobody).is_empty());
        // Globex's agents are too many to scan: the usual path, which the
        // filter still holds to.
        let globex = HardFilters {
            publisher: Some("globex".into()),
            ..Default::default()
        };
        assert!(index.confined(&globex, EXHAUSTIVE_MIN).is_none());
        assert!(found(&index, &globex).iter().all(|&i| !acme(i)));
        // The agents with a value share one copy of it.
        {
            let facts = |i: usize| {
                let slot = index.by_id[records[i].metadata.id.as_str()];
                &index.docs[slot as usize].as_ref().unwrap().facts
            };
            let (a, b) = (facts(3), facts(128));
            assert!(Arc::ptr_eq(
                a.publisher.as_ref().unwrap(),
                b.publisher.as_ref().unwrap()
            ));
            assert!(Arc::ptr_eq(&a.access.owner, &b.access.owner));
            assert!(Arc::ptr_eq(
                a.urn_publisher.as_ref().unwrap(),
                b.urn_publisher.as_ref().unwrap()
            ));
        }
        // An update that moves an agent from Globex to Acme moves it
        // between the lists; one that keeps its publisher keeps its place.
        let mut moved = records[4].clone();
        moved.metadata.publisher = Some("acme".into());
        let at = "2026-11-26T00:00:00Z";
        let prepared = |r: &AgentRecord, revision: u64| {
            let vectors = vector_texts(r).iter().map(|t| stub(t)).collect();
            prepare(
                r,
                revision,
                Some(vectors),
                &Analyzer::default(),
                &Weights::default(),
                at,
            )
        };
        index.apply(prepared(&moved, 6000));
        index.apply(prepared(&records[3], 6001));
        let mut expected = acme_agents.clone();
        expected.push(4);
        expected.sort_unstable();
        assert_eq!(found(&index, &publisher), expected);
        assert_eq!(
            found(&index, &owner),
            acme_agents,
            "the owner did not change"
        );
        // A deleted agent leaves every list.
        index.apply(Prepared {
            id: records[3].metadata.id.clone(),
            revision: 6002,
            doc: None,
        });
        expected.retain(|&i| i != 3);
        assert_eq!(found(&index, &publisher), expected);
        assert_eq!(
            index.confined(&owner, EXHAUSTIVE_MIN).map(|(_, l)| l.len()),
            Some(39)
        );
    }

    #[test]
    fn a_selective_filter_on_the_vector_path_misses_no_agent_it_admits() {
        // 5,000 partitioned agents, no required tag: the vector index
        // gives the candidates. Only 30 agents, scattered, lack the
        // excluded tag, and the query's words reach none of them, so the
        // partitions probed first hold only a few: the scan probes on.
        let words = ["forecast", "invoice", "translate", "summarise", "schedule"];
        let kept = |i: usize| i % 167 == 5;
        let index = partitioned(&words, |i| {
            if kept(i) {
                json!(["t"])
            } else {
                json!(["t", "other"])
            }
        });
        let filters = HardFilters {
            excluded_tags: vec!["other".into()],
            ..Default::default()
        };
        let hits = ask_up_to(&index, "plan a delivery", &filters, &[], 50);
        assert_eq!(hits.len(), 30, "every admitted agent is found");
        assert!(hits.iter().all(|h| h.id[1..].parse().is_ok_and(kept)));
        // A filter that admits nothing answers with nothing, not an error.
        let none = HardFilters {
            excluded_tags: vec!["t".into()],
            ..Default::default()
        };
        assert!(ask(&index, "plan a delivery", &none, &[]).is_empty());
    }

    #[test]
    fn filters_are_hard_whatever_the_score() {
        let index = index_of(&weather_agents());
        let only = |f: HardFilters| -> Vec<String> {
            let mut ids: Vec<String> = ask(&index, "weather forecast", &f, &[])
                .into_iter()
                .map(|h| h.id)
                .collect();
            ids.sort();
            ids
        };
        let tagged = HardFilters {
            required_tags: vec!["weather".into()],
            ..Default::default()
        };
        assert_eq!(only(tagged), ["forecast", "tags"]);
        let not_weather = HardFilters {
            excluded_tags: vec!["weather".into()],
            ..Default::default()
        };
        assert_eq!(only(not_weather), ["farm", "stocks"]);
        let active = HardFilters {
            statuses: vec![AgentStatus::Active],
            ..Default::default()
        };
        assert!(!only(active).contains(&"farm".to_string()));
    }

    #[test]
    fn pruned_units_change_no_answer() {
        // A pool much larger than the head: 150 agents made of random words
        // from a small vocabulary, each with two examples.
        let words: Vec<String> = (0..60).map(|i| format!("w{}x", i * 37 % 1000)).collect();
        let mut seed = 7u64;
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    words[(seed >> 33) as usize % words.len()].clone()
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let agents: Vec<AgentRecord> = (0..150)
            .map(|i| {
                let (description, one, two) = (pick(4), pick(3), pick(3));
                agent(
                    &format!("agent-{i:03}"),
                    &description,
                    json!({"examples": [{"text": one}, {"text": two}]}),
                )
            })
            .collect();
        let queries: Vec<String> = (0..8).map(|_| pick(3)).collect();
        let index = index_of(&agents);
        let filters = HardFilters::default();
        let mut skipped = 0;
        // The defaults, where pruning skips most members; examples weighing
        // twice the profile, where a wrong bound changes answers; and a
        // negative example weight (configurable, so allowed).
        let heavy_examples = Weights {
            example: 2.0,
            ..Weights::default()
        };
        let against_examples = Weights {
            example: -0.5,
            ..Weights::default()
        };
        for weights in [Weights::default(), heavy_examples, against_examples] {
            let ask = |text: &str| {
                let q = Query {
                    text,
                    vector: Some(stub(text)),
                    filters: &filters,
                    preferred_tags: &[],
                    limit: 10,
                    evidence: true,
                    principal: None,
                    now_unix: NOW,
                    leases: None,
                };
                index.search(&weights, &q)
            };
            for text in &queries {
                UNITS_SCORED.set(0);
                let pruned = ask(text);
                let scored_pruned = UNITS_SCORED.get();
                SCORE_EVERY_UNIT.set(true);
                UNITS_SCORED.set(0);
                let every = ask(text);
                let scored_every = UNITS_SCORED.get();
                SCORE_EVERY_UNIT.set(false);
                let view = |hits: &[Hit]| {
                    hits.iter()
                        .map(|h| format!("{} {} {:?}", h.id, h.score, h.components))
                        .collect::<Vec<_>>()
                };
                assert_eq!(view(&pruned), view(&every), "{text}");
                assert_eq!(pruned.len(), 10);
                assert_eq!(scored_every, 100, "{text}");
                skipped += scored_every - scored_pruned;
            }
        }
        assert!(skipped > 40, "only {skipped} members' units were skipped");
    }

    #[test]
    fn the_pool_grows_with_the_limit_and_answers_keep_to_it() {
        assert_eq!(pool_size(1), 100);
        assert_eq!(pool_size(10), 100);
        assert_eq!(pool_size(50), 250);
        let many: Vec<AgentRecord> = (0..150)
            .map(|i| {
                agent(
                    &format!("a{i:03}"),
                    &format!("Weather forecast number {i}."),
                    json!({}),
                )
            })
            .collect();
        let index = index_of(&many);
        let hits = ask(&index, "weather forecast", &HardFilters::default(), &[]);
        assert_eq!(hits.len(), 10);
    }

    #[test]
    fn matched_examples_are_the_examples_closest_to_the_request() {
        let r = agent(
            "travel",
            "Plans trips.",
            json!({"examples": [
                {"id": "e1", "text": "book a flight to Rome"},
                {"id": "e2", "text": "find a hotel near the beach"}
            ]}),
        );
        let index = index_of(std::slice::from_ref(&r));
        let mut hits = ask(
            &index,
            "find a hotel near the beach",
            &HardFilters::default(),
            &[],
        );
        let analyzer = Analyzer::default();
        fill_evidence(
            &mut hits[0],
            &r,
            "find a hotel near the beach",
            &analyzer,
            true,
        );
        assert_eq!(hits[0].snippet.as_deref(), Some("Plans trips."));
        let (unit, score) = &hits[0].matched_units[0];
        assert_eq!(unit.label.as_deref(), Some("e2"));
        assert!(*score > 0.95, "{score}");
        assert_eq!(component(&hits[0], "example"), Some(*score));
        assert!(hits[0]
            .matched_units
            .iter()
            .all(|(u, _)| u.label.as_deref() != Some("e1")));
        // A record changed since it was ranked shows no units: they may no
        // longer be the ones that scored.
        let mut again = ask(
            &index,
            "find a hotel near the beach",
            &HardFilters::default(),
            &[],
        );
        fill_evidence(&mut again[0], &r, "find a hotel", &analyzer, false);
        assert!(again[0].matched_units.is_empty());
        assert!(again[0].snippet.is_some());
    }

    #[test]
    fn stored_vectors_round_trip_and_name_what_they_came_from() {
        let r = change_drink();
        let texts = vector_texts(&r);
        let weights = Weights::default();
        let vectors: Vec<Vec<f32>> = texts.iter().map(|t| stub(t)).collect();
        let p = prepare(&r, 1, Some(vectors), &Analyzer::default(), &weights, "");
        let source = vector_source("stub", &texts, &weights);
        let v = p.doc.as_ref().unwrap().index_vectors(source).unwrap();
        assert_eq!(v.units.len(), 2, "one example, one operation");
        assert_eq!(IndexVectors::decode(&v.encode()), Some(v.clone()));
        assert_eq!(IndexVectors::decode(&v.encode()[..20]), None);
        // Another model, other texts or another profile mix: another source.
        let lighter = Weights {
            profile_examples: 1.0,
            ..Weights::default()
        };
        assert_ne!(vector_source("other", &texts, &weights), source);
        assert_ne!(vector_source("stub", &texts[1..], &weights), source);
        assert_ne!(vector_source("stub", &texts, &lighter), source);
        // An index built from the stored codes ranks as one built from f32.
        let mut from_codes = Index::new(DIM);
        let mut a = analyse(&r, 1, &Analyzer::default(), "");
        a.doc.as_mut().unwrap().attach_stored(v);
        from_codes.apply(a);
        let from_f32 = index_of(&[r]);
        let q = |index: &Index| {
            ask(
                index,
                "change my drink to oat milk",
                &HardFilters::default(),
                &[],
            )
        };
        let (x, y) = (q(&from_codes), q(&from_f32));
        assert_eq!(x.len(), 1);
        assert!((x[0].score - y[0].score).abs() < 1e-6, "{x:?} {y:?}");
        assert_eq!(x[0].matched_positions, y[0].matched_positions);
    }

    #[test]
    fn parameter_texts_read_names_descriptions_allowed_values_and_nesting() {
        assert_eq!(
            parameter_texts(&change_drink()),
            [
                "drink id: The drink to change.",
                "new preferences",
                "size (small, large)",
                "milk type: Kind of milk.",
                "reason",
            ]
        );
        let words = lexical_text(&change_drink());
        assert!(words.contains("milk type: Kind of milk."), "{words}");
    }

    #[test]
    fn parameter_texts_are_capped_per_record() {
        let properties: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("p{i:03}"), json!({"description": "x".repeat(2000)})))
            .collect();
        let r = record(json!({"id": "big", "name": "n", "description": "d",
            "inputs": {"properties": properties}}));
        let texts = parameter_texts(&r);
        assert_eq!(texts.len(), MAX_PARAMETERS);
        assert!(texts.iter().all(|t| t.chars().count() <= PARAMETER_CHARS));
    }

    #[test]
    fn parameters_feed_the_profile_but_are_never_matched_as_examples() {
        let r = change_drink();
        let texts = vector_texts(&r);
        // Context, one example, one operation, then five parameters.
        assert_eq!(texts.len(), 1 + 2 + 5);
        let axis = |i: usize| {
            let mut v = vec![0.0f32; 8];
            v[i] = 1.0;
            v
        };
        let vectors: Vec<Vec<f32>> = (0..texts.len()).map(axis).collect();
        let weights = Weights::default();
        let mut p = analyse(&r, 1, &Analyzer::default(), "");
        let doc = p.doc.as_mut().unwrap();
        doc.attach_vectors(Some(vectors), &weights);
        // Only the units keep vectors of their own (example evidence).
        assert_eq!(doc.unit_vectors.len(), 2);
        // The profile: context plus λ times the mean of all seven others.
        let profile = doc.profile.as_ref().unwrap();
        let share = weights.profile_examples / 7.0;
        let norm = (1.0 + 7.0 * share * share).sqrt();
        assert!((profile[0] - 1.0 / norm).abs() < 1e-6, "{profile:?}");
        for x in &profile[1..8] {
            assert!((x - share / norm).abs() < 1e-6, "{profile:?}");
        }
    }
}
