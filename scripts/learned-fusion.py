"""Offline check of a learned fusion of discovery signals (docs/benchmarks.md,
"A learned fusion of twelve signals").

For every query and every agent of a set it computes twelve signals with
potion-base-8M (model2vec) and BM25 (rank_bm25, lowercase alphanumeric
words): cosines of the query to the profile (name + description plus twice
the mean of the example and parameter vectors, as the index builds it), to
name + description, to the long description, the best and mean cosine to
the examples, the best cosine to a parameter; BM25 over everything and over
each field alone, divided by the query's best. A linear model is fitted by
the listwise softmax loss on one tuning set and scored on the other.

It also measures how much of BFCL's loss is the choice between copies: most
of its functions share their name with others (`uber.ride`, `uber.ride#2`:
the same function as offered in different test cases, described a little
differently), and a query is labelled with the copy of its own test case.

Run with the anchors environment (scripts/anchors.sh creates it):
    ~/.cache/agentry/anchors-venv/bin/python scripts/learned-fusion.py
"""

import json
import os
import re
import sys

import numpy as np
from model2vec import StaticModel
from rank_bm25 import BM25Okapi
from scipy.optimize import minimize

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("AGENTRY_BENCH_DATA", os.path.join(HERE, "../../shared/bench-data"))
MODEL = os.path.expanduser(
    os.environ.get("AGENTRY_MODEL_DIR", "~/.cache/agentry/models/potion-base-8M")
)
WORD = re.compile(r"[a-z0-9]+")


def words(text):
    return WORD.findall(text.lower())


def unit(v):
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def parameter_texts(schema, depth=0, out=None):
    """Name, description and enum values of each property, three levels deep."""
    out = [] if out is None else out
    if not isinstance(schema, dict) or depth > 3:
        return out
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        text = name.replace("_", " ").replace(".", " ") + " " + str(prop.get("description", ""))
        if prop.get("enum"):
            text += " " + " ".join(map(str, prop["enum"]))
        out.append(text[:512])
        parameter_texts(prop, depth + 1, out)
        if isinstance(prop.get("items"), dict):
            parameter_texts(prop["items"], depth + 1, out)
    return out[:32]


def signals(model, set_name, query_file):
    """(names, F[query, agent, signal], Y[query, agent], query ids)."""
    agents = [json.loads(l) for l in open(os.path.join(DATA, set_name, "agents.jsonl"))]
    queries = [json.loads(l) for l in open(os.path.join(DATA, set_name, query_file))]
    at = {a["id"]: i for i, a in enumerate(agents)}
    enc = lambda texts: np.asarray(model.encode(texts), dtype=np.float32)
    name = [a["name"].replace("_", " ").replace(".", " ") for a in agents]
    desc = [a.get("description", "") for a in agents]
    long = [a.get("long_description") or "" for a in agents]
    examples = [a.get("examples") or [] for a in agents]
    params = [parameter_texts(a.get("parameters") or {}) for a in agents]
    head = enc([n + " " + d for n, d in zip(name, desc)])
    v_head = unit(head)
    v_long = unit(enc([l or "-" for l in long]))
    has_long = np.array([1.0 if l else 0.0 for l in long])
    units = [e + p for e, p in zip(examples, params)]
    flat = [u for us in units for u in us]
    v_units = unit(enc(flat)) if flat else np.zeros((0, head.shape[1]))
    at_unit = np.cumsum([0] + [len(u) for u in units])
    v_ex = [v_units[at_unit[i] : at_unit[i] + len(examples[i])] for i in range(len(agents))]
    v_par = [v_units[at_unit[i] + len(examples[i]) : at_unit[i + 1]] for i in range(len(agents))]
    v_profile = unit(
        np.array(
            [
                unit(head[i]) + (2 * v_units[at_unit[i] : at_unit[i + 1]].mean(0) if units[i] else 0)
                for i in range(len(agents))
            ]
        )
    )
    fields = {
        "all": [words(" ".join([name[i], desc[i]] + examples[i] + params[i])) for i in range(len(agents))],
        "name": [words(n) for n in name],
        "desc": [words(d) for d in desc],
        "examples": [words(" ".join(e)) for e in examples],
        "params": [words(" ".join(p)) for p in params],
        "long": [words(l) for l in long],
    }
    bm25 = {k: BM25Okapi([d or ["-"] for d in docs], k1=1.2, b=0.75) for k, docs in fields.items()}
    v_query = unit(enc([q["query"] for q in queries]))
    best = lambda vs, q, f: np.array([f(v @ q) if len(v) else 0.0 for v in vs])
    rows, labels = [], []
    for qi, q in enumerate(queries):
        v = v_query[qi]
        s = {
            "cos_profile": v_profile @ v,
            "cos_name_desc": v_head @ v,
            "cos_long": (v_long @ v) * has_long,
            "cos_example_best": best(v_ex, v, np.max),
            "cos_example_mean": best(v_ex, v, np.mean),
            "cos_param_best": best(v_par, v, np.max),
        }
        terms = words(q["query"])
        for k, index in bm25.items():
            score = np.array(index.get_scores(terms))
            s["bm25_" + k] = score / score.max() if score.max() > 0 else score
        names = sorted(s)
        rows.append(np.stack([s[k] for k in names], 1).astype(np.float32))
        y = np.zeros(len(agents), dtype=np.float32)
        for r in q["relevant_ids"]:
            if r in at:
                y[at[r]] = 1
        labels.append(y)
    return names, np.stack(rows), np.stack(labels), [q["id"] for q in queries]


def ndcg10(scores, labels):
    top = np.argsort(-scores, 1)[:, :10]
    gains = np.take_along_axis(labels, top, 1)
    discount = 1 / np.log2(np.arange(2, 12))
    ideal = -np.sort(-labels, 1)[:, :10]
    return float(((gains * discount).sum(1) / np.maximum((ideal * discount).sum(1), 1e-9)).mean())


def fit(F, Y, temperature=10.0, l2=1e-3):
    """Listwise softmax fit of a linear scorer."""
    target = Y / Y.sum(1, keepdims=True)

    def loss(w):
        s = (F @ w) * temperature
        s -= s.max(1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(1, keepdims=True)
        value = -(target * np.log(p + 1e-12)).sum(1).mean() + l2 * (w @ w)
        grad = ((p - target)[:, :, None] * F).sum(1).mean(0) * temperature + 2 * l2 * w
        return value, grad

    return minimize(loss, np.full(F.shape[2], 0.1), jac=True, method="L-BFGS-B").x


def copies(names, F, Y):
    """BFCL: nDCG@10 with the relevant function's same-name copies taken out
    of the ranking, and how often the relevant copy ranks first among its
    copies, against chance (one in the number of copies)."""
    agents = [json.loads(l) for l in open(os.path.join(DATA, "bfcl-live", "agents.jsonl"))]
    base = [re.sub(r"#\d+$", "", a["name"]) for a in agents]
    group = {}
    for i, b in enumerate(base):
        group.setdefault(b, []).append(i)
    rankings = {
        "BM25 (everything)": F[:, :, names.index("bm25_all")],
        "profile cosine": F[:, :, names.index("cos_profile")],
        "profile + 0.25 * BM25": F[:, :, names.index("cos_profile")] + 0.25 * F[:, :, names.index("bm25_all")],
    }
    print("BFCL, the choice between copies:")
    for label, scores in rankings.items():
        without = scores.copy()
        first = chance = with_copies = 0
        for q in range(len(Y)):
            relevant = np.nonzero(Y[q])[0]
            for i in relevant:
                others = [j for j in group[base[i]] if not Y[q, j]]
                without[q, others] = -np.inf
            if len(relevant) == 1 and len(group[base[relevant[0]]]) > 1:
                copies_of = group[base[relevant[0]]]
                with_copies += 1
                chance += 1 / len(copies_of)
                first += int(max(copies_of, key=lambda j: scores[q, j]) == relevant[0])
        print(
            f"  {label:22s} nDCG@10 {ndcg10(scores, Y):.3f}, copies removed {ndcg10(without, Y):.3f};"
            f" first of its copies {first} of {with_copies} queries (chance {chance:.0f})"
        )


def main():
    model = StaticModel.from_pretrained(MODEL)
    names, F_tune, Y_tune, _ = signals(model, "metatool", "queries_2000.jsonl")
    _, F_all, Y_all, ids = signals(model, "metatool", "queries.jsonl")
    _, F_bfcl, Y_bfcl, _ = signals(model, "bfcl-live", "queries.jsonl")
    tuning = {json.loads(l)["id"] for l in open(os.path.join(DATA, "metatool", "queries_2000.jsonl"))}
    unseen = np.array([i not in tuning for i in ids])
    F_meta, Y_meta = F_all[unseen], Y_all[unseen]
    print(f"MetaTool: {unseen.sum()} queries outside the tuning split; BFCL: {len(Y_bfcl)} queries")
    for k, n in enumerate(names):
        print(f"  {n:18s} MetaTool {ndcg10(F_meta[:, :, k], Y_meta):.3f}  BFCL {ndcg10(F_bfcl[:, :, k], Y_bfcl):.3f}")
    mix = lambda F: F[:, :, names.index("cos_profile")] + 0.25 * F[:, :, names.index("bm25_all")]
    print(f"profile + 0.25 * BM25   MetaTool {ndcg10(mix(F_meta), Y_meta):.3f}  BFCL {ndcg10(mix(F_bfcl), Y_bfcl):.3f}")
    for label, F, Y in [("MetaTool 2,000", F_tune, Y_tune), ("BFCL", F_bfcl, Y_bfcl)]:
        w = fit(F, Y)
        print(f"fitted on {label:15s} MetaTool {ndcg10(F_meta @ w, Y_meta):.3f}  BFCL {ndcg10(F_bfcl @ w, Y_bfcl):.3f}")
        print("  weights: " + ", ".join(f"{n} {x:+.2f}" for n, x in zip(names, w)))
    copies(names, F_bfcl, Y_bfcl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
