"""all-MiniLM-L6-v2 in numpy, standing in for the one `sentence_transformers`
call that the bench-data anchor script (`../shared/bench-data/eval_baselines.py`)
makes: `SentenceTransformer(dir).encode(texts, normalize_embeddings=True)`,
BERT with mean pooling. torch is not installable on a machine of ours without
a large download; this reads the same safetensors weights and tokenizer.

Checked against the published anchors: on MetaTool's 2,000 queries it gives
the figures in `../shared/bench-data/results/metatool_2000.txt` to four
decimals (docs/benchmarks.md).
"""
import json
import os

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer


def _layer_norm(x, weight, bias, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu(x):
    # BERT's exact GELU (not the tanh approximation).
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


class SentenceTransformer:
    def __init__(self, path, device="cpu"):
        self.w = {k: v.astype(np.float32) for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
        config = json.load(open(os.path.join(path, "config.json")))
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        st = json.load(open(os.path.join(path, "sentence_bert_config.json")))
        self.tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(st.get("max_seq_length", 256))

    def _embed(self, ids):
        w = self.w
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        h = self.heads
        d = x.shape[1] // h
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def linear(t, name):
                return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q = linear(x, "attention.self.query").reshape(n, h, d).transpose(1, 0, 2)
            k = linear(x, "attention.self.key").reshape(n, h, d).transpose(1, 0, 2)
            v = linear(x, "attention.self.value").reshape(n, h, d).transpose(1, 0, 2)
            a = q @ k.transpose(0, 2, 1) / np.sqrt(d)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            context = (a @ v).transpose(1, 0, 2).reshape(n, h * d)
            x = _layer_norm(
                x + linear(context, "attention.output.dense"),
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            x = _layer_norm(
                x + linear(_gelu(linear(x, "intermediate.dense")), "output.dense"),
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
            )
        return x.mean(0)

    def encode(self, texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True):
        out = np.stack([self._embed(e.ids) for e in self.tokenizer.encode_batch(list(texts))])
        if normalize_embeddings:
            out /= np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)
        return out
