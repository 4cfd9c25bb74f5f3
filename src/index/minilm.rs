//! Sentence embeddings with all-MiniLM-L6-v2, computed in plain Rust.
//!
//! The built-in static embedder is fast but blind to word order and
//! context; this one runs the actual six-layer BERT encoder that
//! sentence-transformers uses, so the vectors are interchangeable with the
//! ones Python produces for the same model. It deliberately avoids tensor
//! libraries: the model is small, every text is encoded on its own (so there
//! is no padding and no batch matrix to build), and a few loops that LLVM
//! vectorises are all the arithmetic needs.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use safetensors::{Dtype, SafeTensors};
use tokenizers::{Tokenizer, TruncationParams};

/// sentence-transformers' own default when `sentence_bert_config.json` is
/// missing.
const DEFAULT_MAX_SEQ_LENGTH: usize = 256;

/// Below this many multiply-adds (about 0.1 ms) a linear layer is not worth
/// the wake-up round trip of handing half of it to a helper thread.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// A BERT sentence encoder with mean pooling and L2 normalisation.
pub struct MiniLm {
    tokenizer: Tokenizer,
    /// `[vocab][hidden]`, looked up by token id.
    word_embeddings: Vec<f32>,
    /// `[max_tokens][hidden]`; rows past the truncation length are dropped.
    position_embeddings: Vec<f32>,
    /// Single-sentence inputs always have token type 0, so only that row is
    /// kept.
    token_type_embedding: Vec<f32>,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    vocab: usize,
    eps: f32,
    max_tokens: usize,
    /// `[CLS] [SEP]`, what an empty text encodes to; used if the tokenizer
    /// ever fails so that `embed` keeps its one-vector-per-text promise.
    fallback_ids: Vec<u32>,
}

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// A dense layer with PyTorch's `[out][in]` weight layout kept as is, so
/// every output is one contiguous dot product.
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

struct Layer {
    /// Query, key and value stacked into one `[3 * hidden][hidden]` matrix so
    /// the input rows are read once instead of three times.
    qkv: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// Applied to a linear layer's outputs by the thread that computed them,
/// so that the GELU is split across threads along with the matrix product.
#[derive(Clone, Copy)]
enum Activation {
    Identity,
    Gelu,
}

/// Per-text working memory, reused across texts so that encoding allocates
/// nothing but the returned vector once the buffers have grown.
#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    projected: Vec<f32>,
    intermediate: Vec<f32>,
    scores: Vec<f32>,
    /// Output columns computed by helper threads, one buffer per helper;
    /// they travel to the helper with each job and come back filled.
    parts: Vec<Vec<f32>>,
}

/// Threads that take a share of one text's matrix products. They live for a
/// whole `embed` call and wait on a channel between jobs, because spawning
/// a thread per product (24 per text) cost 50-120 µs each on the 2-core
/// machine this was tuned on, a sizeable part of a 10 ms query.
struct Team<'a> {
    helpers: Vec<Helper<'a>>,
}

/// One helper's channels. Each has its own result channel so that, should
/// a helper die, waiting on it fails at once instead of blocking.
struct Helper<'a> {
    jobs: mpsc::Sender<Job<'a>>,
    results: mpsc::Receiver<Vec<f32>>,
}

/// Output rows `rows` of `linear` for every token of `input`, into `out`.
struct Job<'a> {
    linear: &'a Linear,
    /// Shared with the main thread, which takes the buffer back once every
    /// helper has dropped its handle.
    input: Arc<Vec<f32>>,
    rows: Range<usize>,
    activation: Activation,
    out: Vec<f32>,
}

impl<'a> Team<'a> {
    /// Runs `f` with `helpers` helper threads at its disposal (none: `None`).
    fn run<R>(helpers: usize, f: impl FnOnce(Option<&Team<'a>>) -> R) -> R {
        if helpers == 0 {
            return f(None);
        }
        std::thread::scope(|s| {
            let team = Team {
                helpers: (0..helpers)
                    .map(|_| {
                        let (jobs, job_queue) = mpsc::channel::<Job<'a>>();
                        let (done, results) = mpsc::channel();
                        s.spawn(move || {
                            for job in job_queue {
                                let Job {
                                    linear,
                                    input,
                                    rows,
                                    activation,
                                    mut out,
                                } = job;
                                out.resize(input.len() / linear.inputs * rows.len(), 0.0);
                                let width = rows.len();
                                linear.forward_rows(&input, rows, activation, &mut out, width);
                                // Released before replying, so the main thread
                                // can reclaim the buffer as soon as it hears back.
                                drop(input);
                                if done.send(out).is_err() {
                                    break;
                                }
                            }
                        });
                        Helper { jobs, results }
                    })
                    .collect(),
            };
            // Dropping the team closes the job channels, which ends the
            // helpers' loops before the scope joins them.
            f(Some(&team))
        })
    }
}

impl MiniLm {
    /// Loads model.safetensors, tokenizer.json and config.json (and
    /// sentence_bert_config.json for max_seq_length, default 256) from `dir`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let config = read_json(&dir.join("config.json"))?;
        let hidden = config_usize(&config, "hidden_size")?;
        let heads = config_usize(&config, "num_attention_heads")?;
        let layer_count = config_usize(&config, "num_hidden_layers")?;
        let intermediate = config_usize(&config, "intermediate_size")?;
        let eps = config
            .get("layer_norm_eps")
            .and_then(serde_json::Value::as_f64)
            .ok_or("config.json: missing or non-numeric layer_norm_eps")?;
        // Any other activation would silently produce different vectors.
        match config.get("hidden_act").and_then(serde_json::Value::as_str) {
            Some("gelu") => {}
            other => {
                return Err(format!(
                    "config.json: unsupported hidden_act {other:?} (only \"gelu\")"
                ))
            }
        }
        // Relative position schemes need different attention code.
        if let Some(kind) = config.get("position_embedding_type") {
            if kind.as_str() != Some("absolute") {
                return Err(format!(
                    "config.json: unsupported position_embedding_type {kind}"
                ));
            }
        }
        if hidden == 0 || heads == 0 || hidden % heads != 0 || intermediate == 0 {
            return Err(format!(
                "config.json: unusable sizes (hidden_size {hidden}, \
                 num_attention_heads {heads}, intermediate_size {intermediate})"
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(format!("config.json: invalid layer_norm_eps {eps}"));
        }

        let sbert_path = dir.join("sentence_bert_config.json");
        let max_seq_length = if sbert_path.exists() {
            match read_json(&sbert_path)?.get("max_seq_length") {
                None => DEFAULT_MAX_SEQ_LENGTH,
                Some(v) => v
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .ok_or("sentence_bert_config.json: invalid max_seq_length")?,
            }
        } else {
            DEFAULT_MAX_SEQ_LENGTH
        };

        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let tensors =
            SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let weights = Weights { tensors: &tensors };

        let word_embeddings = weights.matrix("embeddings.word_embeddings.weight", None, hidden)?;
        let vocab = word_embeddings.len() / hidden;
        let mut position_embeddings =
            weights.matrix("embeddings.position_embeddings.weight", None, hidden)?;
        // The model has no defined output beyond its learned positions.
        let max_tokens = max_seq_length.min(position_embeddings.len() / hidden);
        if max_tokens < 2 {
            return Err(format!(
                "max_seq_length {max_tokens} leaves no room for [CLS] and [SEP]"
            ));
        }
        position_embeddings.truncate(max_tokens * hidden);
        let mut token_type_embedding =
            weights.matrix("embeddings.token_type_embeddings.weight", None, hidden)?;
        token_type_embedding.truncate(hidden);
        let embeddings_norm = weights.layer_norm("embeddings.LayerNorm", hidden)?;

        // No capacity from the config: a corrupt count must fail on the
        // first missing tensor, not abort on a huge allocation.
        let mut layers = Vec::new();
        for i in 0..layer_count {
            let p = format!("encoder.layer.{i}.");
            let query = weights.linear(&format!("{p}attention.self.query"), hidden, hidden)?;
            let key = weights.linear(&format!("{p}attention.self.key"), hidden, hidden)?;
            let value = weights.linear(&format!("{p}attention.self.value"), hidden, hidden)?;
            layers.push(Layer {
                qkv: Linear {
                    weight: [query.weight, key.weight, value.weight].concat(),
                    bias: [query.bias, key.bias, value.bias].concat(),
                    inputs: hidden,
                    outputs: 3 * hidden,
                },
                attention_output: weights.linear(
                    &format!("{p}attention.output.dense"),
                    hidden,
                    hidden,
                )?,
                attention_norm: weights
                    .layer_norm(&format!("{p}attention.output.LayerNorm"), hidden)?,
                intermediate: weights.linear(
                    &format!("{p}intermediate.dense"),
                    hidden,
                    intermediate,
                )?,
                output: weights.linear(&format!("{p}output.dense"), intermediate, hidden)?,
                output_norm: weights.layer_norm(&format!("{p}output.LayerNorm"), hidden)?,
            });
        }

        let path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // tokenizer.json ships with padding and truncation fixed at 128;
        // sentence-transformers overrides both, and so must we.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..TruncationParams::default()
            }))
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        if tokenizer.get_vocab_size(true) > vocab {
            return Err(format!(
                "tokenizer.json has {} tokens but the model only {vocab} embeddings",
                tokenizer.get_vocab_size(true)
            ));
        }
        let special = |name: &str| {
            tokenizer
                .token_to_id(name)
                .ok_or_else(|| format!("tokenizer.json: no {name} token"))
        };
        let fallback_ids = vec![special("[CLS]")?, special("[SEP]")?];

        Ok(Self {
            tokenizer,
            word_embeddings,
            position_embeddings,
            token_type_embedding,
            embeddings_norm,
            layers,
            hidden,
            heads,
            intermediate,
            vocab,
            eps: eps as f32,
            max_tokens,
            fallback_ids,
        })
    }

    /// The model's hidden size (384 for MiniLM-L6), which mean pooling
    /// carries through to the sentence vector.
    pub fn dim(&self) -> usize {
        self.hidden
    }

    /// One unit-length vector per text, same order; texts truncated to
    /// max_seq_length tokens (incl. [CLS]/[SEP]).
    ///
    /// Texts are handed out one at a time from a shared counter rather than
    /// in fixed chunks, because cost grows with length and a chunk of long
    /// texts would leave the other threads idle. With fewer texts than cores
    /// (a single query, typically) the spare cores split each text's matrix
    /// products instead.
    pub fn embed(&self, texts: &[String]) -> Vec<Vec<f32>> {
        if texts.is_empty() {
            return Vec::new();
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let workers = cores.min(texts.len());
        let helpers = cores / workers - 1;
        if workers == 1 {
            return Team::run(helpers, |team| {
                let mut scratch = Scratch::default();
                texts
                    .iter()
                    .map(|t| self.embed_one(t, &mut scratch, team))
                    .collect()
            });
        }
        let next = AtomicUsize::new(0);
        let work = || {
            Team::run(helpers, |team| {
                let mut scratch = Scratch::default();
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(text) = texts.get(i) else { break };
                    done.push((i, self.embed_one(text, &mut scratch, team)));
                }
                done
            })
        };
        let mut out = vec![Vec::new(); texts.len()];
        std::thread::scope(|s| {
            let others: Vec<_> = (1..workers).map(|_| s.spawn(work)).collect();
            let mut finished = vec![work()];
            finished.extend(others.into_iter().filter_map(|h| h.join().ok()));
            for (i, v) in finished.into_iter().flatten() {
                if let Some(slot) = out.get_mut(i) {
                    *slot = v;
                }
            }
        });
        // Only reachable if a worker thread died: redo its share here rather
        // than return a short or misaligned result.
        let mut scratch = Scratch::default();
        for (slot, text) in out.iter_mut().zip(texts) {
            if slot.is_empty() {
                *slot = self.embed_one(text, &mut scratch, None);
            }
        }
        out
    }

    fn embed_one<'a>(
        &'a self,
        text: &str,
        scratch: &mut Scratch,
        team: Option<&Team<'a>>,
    ) -> Vec<f32> {
        let ids = match self.tokenizer.encode_fast(text, true) {
            Ok(encoding) if !encoding.get_ids().is_empty() => encoding.get_ids().to_vec(),
            _ => self.fallback_ids.clone(),
        };
        self.encode_ids(&ids, scratch, team)
    }

    fn encode_ids<'a>(&'a self, ids: &[u32], s: &mut Scratch, team: Option<&Team<'a>>) -> Vec<f32> {
        let h = self.hidden;
        let ids = &ids[..ids.len().min(self.max_tokens)];
        let n = ids.len();
        s.hidden.resize(n * h, 0.0);
        s.qkv.resize(n * 3 * h, 0.0);
        s.context.resize(n * h, 0.0);
        s.projected.resize(n * h, 0.0);
        s.intermediate.resize(n * self.intermediate, 0.0);
        s.scores.resize(n, 0.0);

        for ((row, &id), position) in s
            .hidden
            .chunks_exact_mut(h)
            .zip(ids)
            .zip(self.position_embeddings.chunks_exact(h))
        {
            // The load-time vocabulary check makes the clamp a no-op; it only
            // guarantees that no id can index out of bounds.
            let id = (id as usize).min(self.vocab - 1);
            let word = &self.word_embeddings[id * h..(id + 1) * h];
            for (((x, w), p), t) in row
                .iter_mut()
                .zip(word)
                .zip(position)
                .zip(&self.token_type_embedding)
            {
                *x = w + p + t;
            }
        }
        self.embeddings_norm.apply(&mut s.hidden, self.eps);

        for layer in &self.layers {
            let parts = &mut s.parts;
            let identity = Activation::Identity;
            layer
                .qkv
                .forward(&mut s.hidden, &mut s.qkv, identity, team, parts);
            self.attention(&s.qkv, &mut s.context, &mut s.scores);
            layer
                .attention_output
                .forward(&mut s.context, &mut s.projected, identity, team, parts);
            add_assign(&mut s.hidden, &s.projected);
            layer.attention_norm.apply(&mut s.hidden, self.eps);

            let gelu = Activation::Gelu;
            layer
                .intermediate
                .forward(&mut s.hidden, &mut s.intermediate, gelu, team, parts);
            layer
                .output
                .forward(&mut s.intermediate, &mut s.projected, identity, team, parts);
            add_assign(&mut s.hidden, &s.projected);
            layer.output_norm.apply(&mut s.hidden, self.eps);
        }

        // Mean over every token, [CLS] and [SEP] included, as
        // sentence-transformers does when the attention mask is all ones.
        // The 1/n of the mean cancels in the normalisation.
        let mut pooled = vec![0.0f32; h];
        for row in s.hidden.chunks_exact(h) {
            add_assign(&mut pooled, row);
        }
        let norm = pooled.iter().map(|x| x * x).sum::<f32>().sqrt();
        let scale = 1.0 / norm.max(1e-12);
        for x in &mut pooled {
            *x *= scale;
        }
        pooled
    }

    /// Scaled dot-product self-attention over the whole (unpadded) text:
    /// q, k and v come from the fused projection `qkv` (`[n][3 * hidden]`),
    /// and the heads' contexts are written side by side into `context`.
    fn attention(&self, qkv: &[f32], context: &mut [f32], scores: &mut [f32]) {
        let h = self.hidden;
        let head_dim = h / self.heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let n = qkv.len() / (3 * h);
        for head in 0..self.heads {
            let q_at = head * head_dim;
            let k_at = h + q_at;
            let v_at = 2 * h + q_at;
            // Padding a short last group with the final key keeps every score
            // on the vectorised four-at-a-time path; the extras are dropped.
            let key = |j: usize| {
                let start = j.min(n - 1) * 3 * h + k_at;
                &qkv[start..start + head_dim]
            };
            for (query_row, context_row) in qkv.chunks_exact(3 * h).zip(context.chunks_exact_mut(h))
            {
                let query = &query_row[q_at..q_at + head_dim];
                for (first, group) in scores.chunks_mut(4).enumerate() {
                    let j = 4 * first;
                    let sums = dot4([key(j), key(j + 1), key(j + 2), key(j + 3)], query);
                    for (score, sum) in group.iter_mut().zip(sums) {
                        *score = sum * scale;
                    }
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0;
                for score in scores.iter_mut() {
                    *score = (*score - max).exp();
                    total += *score;
                }
                let out = &mut context_row[q_at..q_at + head_dim];
                out.fill(0.0);
                for (&score, value_row) in scores.iter().zip(qkv.chunks_exact(3 * h)) {
                    let weight = score / total;
                    for (c, v) in out.iter_mut().zip(&value_row[v_at..v_at + head_dim]) {
                        *c += weight * v;
                    }
                }
            }
        }
    }
}

impl Linear {
    /// `output[t] = activation(weight · input[t] + bias)` for every token
    /// row, with the weight's output rows shared out over the team. Splitting
    /// by output keeps each weight row on one core, so the weights (most of
    /// the memory traffic for short texts) are still read once in total.
    ///
    /// `input` is only read; it is taken by value for the duration so that
    /// the helpers can share it without copying.
    fn forward<'a>(
        &'a self,
        input: &mut Vec<f32>,
        output: &mut [f32],
        activation: Activation,
        team: Option<&Team<'a>>,
        parts: &mut Vec<Vec<f32>>,
    ) {
        let no = self.outputs;
        let tokens = input.len() / self.inputs;
        let helpers = match team {
            Some(team) if tokens * self.inputs * no >= PARALLEL_MIN_WORK => &team.helpers[..],
            _ => &[],
        };
        let threads = (helpers.len() + 1).min(no.div_ceil(4));
        if threads <= 1 {
            self.forward_rows(input, 0..no, activation, output, no);
            return;
        }
        let helpers = &helpers[..threads - 1];
        // Multiples of four, so that no group of four weight rows is split.
        let share = no.div_ceil(threads).next_multiple_of(4);
        let range = |k: usize| (k * share).min(no)..((k + 1) * share).min(no);
        parts.resize_with(helpers.len(), Vec::new);

        let shared = Arc::new(std::mem::take(input));
        for (k, (helper, part)) in helpers.iter().zip(parts.iter_mut()).enumerate() {
            let job = Job {
                linear: self,
                input: Arc::clone(&shared),
                rows: range(k + 1),
                activation,
                out: std::mem::take(part),
            };
            // A failed send means the helper is gone; the receive below then
            // fails too and the share is computed here instead.
            let _ = helper.jobs.send(job);
        }
        self.forward_rows(&shared, range(0), activation, output, no);
        for (k, (helper, part)) in helpers.iter().zip(parts.iter_mut()).enumerate() {
            let rows = range(k + 1);
            *part = helper.results.recv().unwrap_or_else(|_| {
                let mut own = vec![0.0; tokens * rows.len()];
                self.forward_rows(&shared, rows.clone(), activation, &mut own, rows.len());
                own
            });
            if rows.is_empty() {
                continue;
            }
            for (out_row, part_row) in output
                .chunks_exact_mut(no)
                .zip(part.chunks_exact(rows.len()))
            {
                out_row[rows.clone()].copy_from_slice(part_row);
            }
        }
        *input = Arc::try_unwrap(shared).unwrap_or_else(|still_shared| still_shared.to_vec());
    }

    /// Computes output rows `rows` for every token into `out`, whose token
    /// rows are `width` wide and begin with output row `rows.start`.
    ///
    /// Weight rows go four at a time against four tokens at a time: each
    /// block of weight rows is then read from memory once per text and each
    /// load is shared by four products. Leftover tokens (fewer than four)
    /// swap roles and take four weight rows per call instead.
    fn forward_rows(
        &self,
        input: &[f32],
        rows: Range<usize>,
        activation: Activation,
        out: &mut [f32],
        width: usize,
    ) {
        let ni = self.inputs;
        let tokens = input.len() / ni;
        let full = tokens / 4 * 4;
        let (blocked, rest) = input.split_at(full * ni);
        let Some(last) = rows.end.checked_sub(1) else {
            return;
        };
        for o in rows.clone().step_by(4) {
            // A short final group repeats its last row; the extra results
            // are computed and discarded.
            let weight = |k: usize| {
                let r = (o + k).min(last);
                &self.weight[r * ni..(r + 1) * ni]
            };
            let group = [weight(0), weight(1), weight(2), weight(3)];
            let live = (rows.end - o).min(4);
            let bias = &self.bias[o..o + live];
            let at = o - rows.start;
            for (block, x) in blocked.chunks_exact(4 * ni).enumerate() {
                let (x0, x) = x.split_at(ni);
                let (x1, x) = x.split_at(ni);
                let (x2, x3) = x.split_at(ni);
                for (k, (w, b)) in group.iter().zip(bias).enumerate() {
                    let sums = dot4([x0, x1, x2, x3], w);
                    for (t, sum) in sums.into_iter().enumerate() {
                        out[(4 * block + t) * width + at + k] = sum + b;
                    }
                }
            }
            for (t, x) in rest.chunks_exact(ni).enumerate() {
                let sums = dot4(group, x);
                let dest = &mut out[(full + t) * width + at..][..live];
                for ((d, sum), b) in dest.iter_mut().zip(sums).zip(bias) {
                    *d = sum + b;
                }
            }
        }
        if let Activation::Gelu = activation {
            for row in out.chunks_exact_mut(width) {
                gelu_in_place(&mut row[..rows.len()]);
            }
        }
    }
}

impl LayerNorm {
    /// Normalises every `gamma.len()`-wide row of `rows` in place.
    fn apply(&self, rows: &mut [f32], eps: f32) {
        let width = self.gamma.len();
        for row in rows.chunks_exact_mut(width) {
            // f64 sums keep the variance exact enough that the 1e-12 epsilon
            // is not drowned by rounding.
            let mean = row.iter().map(|&x| f64::from(x)).sum::<f64>() / width as f64;
            let var = row
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / width as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            for ((x, g), b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
                *x = ((f64::from(*x) - mean) * inv) as f32 * g + b;
            }
        }
    }
}

fn add_assign(target: &mut [f32], add: &[f32]) {
    for (t, a) in target.iter_mut().zip(add) {
        *t += a;
    }
}

/// Four dot products of `xs` with `w`, sharing every load of `w`.
///
/// Eight independent partial sums per product break the floating-point
/// dependency chain, which is what lets LLVM turn the loop into vector
/// instructions; a single dot product written the same way stays scalar,
/// which is why everything goes through this four-wide form.
#[inline]
fn dot4(xs: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    let [x0, x1, x2, x3] = xs;
    let mut acc = [[0.0f32; 8]; 4];
    let chunks = w
        .chunks_exact(8)
        .zip(x0.chunks_exact(8))
        .zip(x1.chunks_exact(8))
        .zip(x2.chunks_exact(8))
        .zip(x3.chunks_exact(8));
    for ((((w, a), b), c), d) in chunks {
        for (i, &wi) in w.iter().enumerate() {
            acc[0][i] += a[i] * wi;
            acc[1][i] += b[i] * wi;
            acc[2][i] += c[i] * wi;
            acc[3][i] += d[i] * wi;
        }
    }
    let mut sums = acc.map(|a| ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])));
    // Widths that are not a multiple of eight (never the case for MiniLM).
    let done = w.len() / 8 * 8;
    for (sum, x) in sums.iter_mut().zip(xs) {
        let tail = x.get(done..).unwrap_or_default();
        *sum += tail.iter().zip(&w[done..]).map(|(a, b)| a * b).sum::<f32>();
    }
    sums
}

/// BERT's exact GELU, `x * Φ(x)`, over a whole buffer; the tanh
/// approximation would drift from the reference vectors by more than the
/// tolerance we promise. Branch-free, so that LLVM vectorises the loop: with
/// one scalar libm `exp` per element this was a fifth of the encoder's time.
fn gelu_in_place(values: &mut [f32]) {
    for x in values {
        *x = gelu(*x);
    }
}

#[inline]
fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// Error function via a Chebyshev-fitted erfc (absolute error below 1.2e-7
/// everywhere), as std has none. Evaluated in f64 because the polynomial's
/// large alternating coefficients lose several bits in f32.
#[inline]
fn erf(x: f64) -> f64 {
    // Past 6, erfc is below 1e-17 and the exponent below stays in range.
    let z = x.abs().min(6.0);
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * exp_nonpositive(poly - z * z);
    (1.0 - erfc).copysign(x)
}

/// `e^x` for `-700 <= x <= 0`, within a few ulp; libm's `exp` is a call
/// per element and blocks vectorisation.
///
/// Splits `x = k ln 2 + r` with `|r| <= ln 2 / 2`, so `e^x = 2^k e^r`; `e^r`
/// is a Taylor polynomial (truncation error below 2e-14) and `2^k` is built
/// from its exponent bits.
#[inline]
fn exp_nonpositive(x: f64) -> f64 {
    // Adding 1.5 * 2^52 rounds to an integer, which then sits in the low
    // mantissa bits, two's complement.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    const LN2_HI: f64 = 0.693_147_180_369_123_8;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    let x = x.clamp(-700.0, 0.0);
    let shifted = x * std::f64::consts::LOG2_E + ROUND;
    let k = shifted - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 1/12!, 1/11!, ..., 1/0!
    const TAYLOR: [f64; 13] = [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let p = TAYLOR.iter().fold(0.0, |p, &c| p * r + c);
    // k + 1023 is the biased exponent; the shift drops the rounding bits.
    let scale = f64::from_bits(shifted.to_bits().wrapping_add(1023) << 52);
    p * scale
}

fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn config_usize(config: &serde_json::Value, key: &str) -> Result<usize, String> {
    config
        .get(key)
        .and_then(serde_json::Value::as_u64)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("config.json: missing or invalid {key}"))
}

/// Tensor lookup that tolerates both export styles: `BertModel` checkpoints
/// name tensors `embeddings.…`, `BertFor…` ones prefix them with `bert.`.
struct Weights<'a> {
    tensors: &'a SafeTensors<'a>,
}

impl Weights<'_> {
    /// A 2-D (or, with `rows: None`, any-height) f32 tensor whose rows are
    /// `cols` wide, flattened row-major.
    fn matrix(&self, name: &str, rows: Option<usize>, cols: usize) -> Result<Vec<f32>, String> {
        let view = self
            .tensors
            .tensor(name)
            .or_else(|_| self.tensors.tensor(&format!("bert.{name}")))
            .map_err(|_| format!("model.safetensors: missing tensor {name}"))?;
        if view.dtype() != Dtype::F32 {
            return Err(format!(
                "model.safetensors: {name} is {:?}, only F32 is supported",
                view.dtype()
            ));
        }
        let shape = view.shape();
        let ok = match (shape, rows) {
            ([r, c], Some(rows)) => *r == rows && *c == cols,
            ([r, c], None) => *r > 0 && *c == cols,
            ([c], Some(1)) => *c == cols,
            _ => false,
        };
        if !ok {
            let want = rows.map_or("n".to_string(), |r| r.to_string());
            return Err(format!(
                "model.safetensors: {name} has shape {shape:?}, expected [{want}, {cols}]"
            ));
        }
        view.data()
            .chunks_exact(4)
            .map(|b| {
                b.try_into()
                    .map(f32::from_le_bytes)
                    .map_err(|_| format!("model.safetensors: {name} is truncated"))
            })
            .collect()
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, String> {
        self.matrix(name, Some(1), len)
    }

    fn linear(&self, prefix: &str, inputs: usize, outputs: usize) -> Result<Linear, String> {
        Ok(Linear {
            weight: self.matrix(&format!("{prefix}.weight"), Some(outputs), inputs)?,
            bias: self.vector(&format!("{prefix}.bias"), outputs)?,
            inputs,
            outputs,
        })
    }

    fn layer_norm(&self, prefix: &str, width: usize) -> Result<LayerNorm, String> {
        Ok(LayerNorm {
            gamma: self.vector(&format!("{prefix}.weight"), width)?,
            beta: self.vector(&format!("{prefix}.bias"), width)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::OnceLock;

    /// The model is ~90 MB and not in the repository, so these tests run
    /// only where someone has put it in place.
    fn model() -> Option<&'static MiniLm> {
        static MODEL: OnceLock<Result<MiniLm, PathBuf>> = OnceLock::new();
        let loaded = MODEL.get_or_init(|| {
            let dir = std::env::var_os("AGENTRY_MINILM_DIR")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|home| {
                        PathBuf::from(home).join(".cache/agentry/models/all-MiniLM-L6-v2")
                    })
                })
                .unwrap_or_default();
            if !dir.join("model.safetensors").is_file() {
                return Err(dir);
            }
            match MiniLm::load(&dir) {
                Ok(model) => Ok(model),
                Err(e) => panic!("loading {}: {e}", dir.display()),
            }
        });
        match loaded {
            Ok(model) => Some(model),
            Err(dir) => {
                eprintln!("skipping: no MiniLM model in {:?}", dir);
                None
            }
        }
    }

    fn embed(model: &MiniLm, texts: &[&str]) -> Vec<Vec<f32>> {
        let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        model.embed(&texts)
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn vectors_have_unit_length() {
        let Some(model) = model() else { return };
        assert_eq!(model.dim(), 384);
        let texts = [
            "",
            " ",
            "hello",
            "Résumé — 東京 🚀",
            "A man is eating food.",
        ];
        let vectors = embed(model, &texts);
        assert_eq!(vectors.len(), texts.len());
        for v in &vectors {
            assert_eq!(v.len(), 384);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        }
    }

    #[test]
    fn similar_sentences_score_higher() {
        let Some(model) = model() else { return };
        let v = embed(
            model,
            &[
                "A man is eating food.",
                "A man is eating a piece of bread.",
                "A man is riding a horse.",
            ],
        );
        let bread = cosine(&v[0], &v[1]);
        let horse = cosine(&v[0], &v[2]);
        assert!(bread > 0.7, "bread {bread}");
        assert!(horse < 0.35, "horse {horse}");
    }

    #[test]
    fn matches_reference_values() {
        let Some(model) = model() else { return };
        let v = embed(model, &["A man is eating food."]);
        // From an independent float64 numpy implementation of the model.
        let expected = [0.033_241_573, 0.004_406_064, -0.006_276_945];
        for (got, want) in v[0].iter().zip(expected) {
            assert!((got - want).abs() < 1e-4, "got {got}, want {want}");
        }
    }

    #[test]
    fn long_text_is_truncated() {
        let Some(model) = model() else { return };
        let long = "word after word after word ".repeat(500);
        let v = embed(model, &[&long, &"x".repeat(10_000)]);
        assert_eq!(v.len(), 2);
        assert!(v
            .iter()
            .all(|v| v.len() == 384 && v.iter().all(|x| x.is_finite())));
    }

    #[test]
    fn batch_matches_single_texts() {
        let Some(model) = model() else { return };
        let texts = ["first text", "", "a somewhat longer third text here", "4"];
        let batch = embed(model, &texts);
        for (text, v) in texts.iter().zip(&batch) {
            assert_eq!(&embed(model, &[text])[0], v);
        }
    }

    #[test]
    fn empty_batch_gives_nothing() {
        let Some(model) = model() else { return };
        assert!(model.embed(&[]).is_empty());
    }

    #[test]
    fn erf_and_gelu_match_known_values() {
        let erfs = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.5, -0.966_105_146_475_310_8),
            (3.0, 0.999_977_909_503_001_4),
            (-6.0, -1.0),
        ];
        for (x, want) in erfs {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
        let gelus = [
            (0.0, 0.0),
            (1.0, 0.841_344_8),
            (-1.0, -0.158_655_26),
            (2.5, 2.484_475_9),
            (-3.0, -0.004_049_694),
            (-10.0, 0.0),
        ];
        for (x, want) in gelus {
            assert!((gelu(x) - want).abs() < 1e-6, "gelu({x}) = {}", gelu(x));
        }
    }

    #[test]
    fn erf_is_accurate_across_its_range() {
        // Maclaurin series, exact to ~1e-14 in f64 for |x| <= 3.
        let series = |x: f64| {
            let (mut term, mut sum) = (x, x);
            for n in 1..80 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * std::f64::consts::FRAC_2_SQRT_PI
        };
        for i in -3000..=3000 {
            let x = f64::from(i) / 1000.0;
            assert!((erf(x) - series(x)).abs() < 1.5e-7, "erf({x})");
        }
    }

    #[test]
    fn fast_exp_matches_std() {
        for i in 0..=70_000 {
            let x = -f64::from(i) / 100.0;
            let (got, want) = (exp_nonpositive(x), x.exp());
            assert!(
                (got - want).abs() <= want * 1e-14,
                "exp({x}): {got} vs {want}"
            );
        }
    }

    fn write_config(dir: &Path, activation: &str) {
        let config = serde_json::json!({
            "hidden_size": 4,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "intermediate_size": 8,
            "layer_norm_eps": 1e-12,
            "hidden_act": activation,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
    }

    #[test]
    fn unsupported_activation_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_config(dir.path(), "relu");
        let err = MiniLm::load(dir.path())
            .err()
            .expect("relu must be rejected");
        assert!(err.contains("hidden_act"), "{err}");
    }

    #[test]
    fn missing_or_misshapen_tensors_are_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_config(dir.path(), "gelu");
        let floats = |n: usize| vec![0u8; n * 4];
        let (word, position, token_type) = (floats(10 * 4), floats(8 * 4), floats(2 * 4));
        let views = |token_type_shape: Vec<usize>| {
            vec![
                (
                    "bert.embeddings.word_embeddings.weight",
                    safetensors::tensor::TensorView::new(Dtype::F32, vec![10, 4], &word),
                ),
                (
                    "bert.embeddings.position_embeddings.weight",
                    safetensors::tensor::TensorView::new(Dtype::F32, vec![8, 4], &position),
                ),
                (
                    "bert.embeddings.token_type_embeddings.weight",
                    safetensors::tensor::TensorView::new(Dtype::F32, token_type_shape, &token_type),
                ),
            ]
            .into_iter()
            .map(|(name, view)| (name, view.expect("view")))
            .collect::<Vec<_>>()
        };
        let path = dir.path().join("model.safetensors");

        safetensors::tensor::serialize_to_file(views(vec![4, 2]), &None, &path).expect("write");
        let err = MiniLm::load(dir.path()).err().expect("bad shape");
        assert!(
            err.contains("token_type_embeddings") && err.contains("shape"),
            "{err}"
        );

        safetensors::tensor::serialize_to_file(views(vec![2, 4]), &None, &path).expect("write");
        let err = MiniLm::load(dir.path()).err().expect("missing tensor");
        assert!(
            err.contains("missing tensor embeddings.LayerNorm.weight"),
            "{err}"
        );
    }
}
