#!/usr/bin/env python3
"""Times what an operator or an expert would use instead of Agentry, on the
corpus and query vectors `agentry bench discover` wrote to DIR:

- PostgreSQL 15: the lexical + tag part (tsvector with a GIN index,
  ts_rank, tag filter on a GIN-indexed text[]), over a Unix socket;
- LanceDB (embedded, Rust core): the full hybrid query (full-text + vector
  + tag prefilter), in-process;
- the expert peer: tantivy (BM25) and usearch (HNSW) fused by reciprocal
  rank fusion, in-process, as an engineer who knows the field would
  assemble it — plain, and tuned with the two things Agentry's own
  pipeline does (query terms held by over a quarter of the agents are
  ignored; a selective tag's holders are scanned exactly instead of
  filtering HNSW results).

Usage: bench-peers.py DIR PG_BIN_DIR CLIENTS(comma-separated) [MODE]
MODE, a comma-separated list of peers (default: postgres,lancedb,expert),
times those and prints one JSON object per measured run; MODE `rank` only ranks DIR's labelled queries with the
expert peer (`agentry eval --expert`) and prints, per query, its top ten
ids by BM25 alone, by vector alone and fused (plain and tuned).
"""
import json, os, shutil, subprocess, sys, tempfile, threading, time

d, pg_bin, clients = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")]
mode = sys.argv[4] if len(sys.argv) > 4 else "postgres,lancedb,expert"
corpus = [json.loads(l) for l in open(os.path.join(d, "corpus.jsonl"))]
queries = [json.loads(l) for l in open(os.path.join(d, "queries.jsonl"))]
n = len(corpus)


def measure(name, run_one, concurrency):
    lat, lock = [], threading.Lock()
    todo = list(range(len(queries)))
    def worker():
        state = {}
        while True:
            with lock:
                if not todo:
                    return
                k = todo.pop()
            t = time.perf_counter()
            run_one(queries[k], state)
            e = time.perf_counter() - t
            with lock:
                lat.append(e)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.perf_counter() - t0
    lat.sort()
    pct = lambda p: lat[round((len(lat) - 1) * p)] * 1e6
    print(json.dumps({"system": name, "agents": n, "clients": concurrency,
                      "p50_us": pct(0.5), "p99_us": pct(0.99), "per_second": len(lat) / wall}), flush=True)


# ---- PostgreSQL ----
def postgres():
    import psycopg
    work = tempfile.mkdtemp(prefix="agentry-pg-")
    data, sock = os.path.join(work, "data"), work
    os.chmod(work, 0o777)
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(as_pg + [os.path.join(pg_bin, "initdb"), "-D", data, "-A", "trust", "-U", "bench"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(as_pg + [os.path.join(pg_bin, "pg_ctl"), "-D", data, "-w", "-l", os.path.join(work, "log"),
                    "-o", f"-k {sock} -c listen_addresses='' -c shared_buffers=512MB -c max_connections=64",
                    "start"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        conninfo = f"host={sock} dbname=postgres user=bench"
        with psycopg.connect(conninfo, autocommit=True) as c:
            c.execute("CREATE TABLE agents (id text PRIMARY KEY, tags text[], tsv tsvector)")
            t = time.perf_counter()
            with c.cursor().copy("COPY agents (id, tags, tsv) FROM STDIN") as cp:
                for a in corpus:
                    cp.write_row((a["id"], a["tags"], None))
            c.execute("CREATE TEMP TABLE texts (id text, body text)")
            with c.cursor().copy("COPY texts (id, body) FROM STDIN") as cp:
                for a in corpus:
                    cp.write_row((a["id"], a["text"]))
            c.execute("UPDATE agents SET tsv = to_tsvector('english', texts.body) FROM texts WHERE texts.id = agents.id")
            c.execute("CREATE INDEX ON agents USING gin (tsv)")
            c.execute("CREATE INDEX ON agents USING gin (tags)")
            c.execute("VACUUM ANALYZE agents")
            build = time.perf_counter() - t
        print(json.dumps({"system": "postgres", "agents": n, "build_secs": build}), flush=True)
        # OR of the query's words, as BM25 and Agentry's lexical stage treat them.
        sql = ("SELECT id, ts_rank(tsv, qq.q) AS r FROM agents, "
               "(SELECT replace(plainto_tsquery('english', %s)::text, '&', '|')::tsquery AS q) AS qq "
               "WHERE tsv @@ qq.q {} ORDER BY r DESC LIMIT 10")
        def one(qr, state):
            conn = state.get("c")
            if conn is None:
                conn = state["c"] = psycopg.connect(conninfo, autocommit=True)
            if qr["tag"]:
                conn.execute(sql.format("AND tags @> ARRAY[%s]"), (qr["text"], qr["tag"])).fetchall()
            else:
                conn.execute(sql.format(""), (qr["text"],)).fetchall()
        for cl in clients:
            measure("postgres lexical+tag", one, cl)
    finally:
        subprocess.run(as_pg + [os.path.join(pg_bin, "pg_ctl"), "-D", data, "-m", "fast", "stop"],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


# ---- LanceDB ----
def lance():
    import lancedb, pyarrow as pa
    work = tempfile.mkdtemp(prefix="agentry-lance-")
    try:
        db = lancedb.connect(work)
        dim = len(corpus[0]["vector"])
        schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("tags", pa.list_(pa.string())),
                            ("vector", pa.list_(pa.float32(), dim))])
        t = time.perf_counter()
        table = db.create_table("agents", data=pa.Table.from_pylist(
            [{"id": a["id"], "text": a["text"], "tags": a["tags"], "vector": a["vector"]} for a in corpus], schema=schema))
        table.create_fts_index("text", with_position=True)
        if n >= 10000:
            table.create_index(metric="cosine", vector_column_name="vector")
        table.create_scalar_index("tags", index_type="LABEL_LIST")
        build = time.perf_counter() - t
        print(json.dumps({"system": "lancedb", "agents": n, "build_secs": build}), flush=True)
        def one(qr, state):
            q = table.search(query_type="hybrid").vector(qr["vector"]).text(qr["text"])
            if qr["tag"]:
                q = q.where(f"array_has_any(tags, ['{qr['tag']}'])", prefilter=True)
            q.limit(10).to_list()
        for cl in clients:
            measure("lancedb hybrid", one, cl)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- The expert peer: tantivy + usearch + RRF ----
RRF_K = 60          # the constant of Cormack et al.'s reciprocal rank fusion
POOL = 100          # candidates each engine hands to the fusion
FREQUENT = 0.25     # tuned: query terms held by more of the agents are ignored
EXACT_TAG = 4096    # tuned: a tag with at most this many holders is scanned exactly
OVERSAMPLE = 1000   # plain: HNSW results fetched before filtering by tag


class Expert:
    """BM25 over the agent's text (tantivy, English stemming) and cosine
    over one vector per agent (usearch HNSW, M 16, ef 128 / 64), each
    giving its best POOL, fused by RRF."""

    def __init__(self, docs):
        import numpy as np, tantivy
        from usearch.index import Index
        self.np, self.tantivy = np, tantivy
        self.ids = [a["id"] for a in docs]
        self.n = len(docs)
        started = time.perf_counter()
        self.analyzer = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
                         .filter(tantivy.Filter.lowercase())
                         .filter(tantivy.Filter.stemmer("english")).build())
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("text", tokenizer_name="stem", index_option="freq")
        sb.add_text_field("tags", tokenizer_name="raw", index_option="basic")
        self.schema = sb.build()
        self.index = tantivy.Index(self.schema)
        self.index.register_tokenizer("stem", self.analyzer)
        # One writer thread and a heap that holds everything: one segment,
        # whose document numbers are the corpus rows.
        w = self.index.writer(1 << 30, 1)
        for a in docs:
            w.add_document(tantivy.Document(text=a["text"], tags=a.get("tags") or []))
        w.commit()
        w.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()
        if self.searcher.num_segments != 1:
            raise RuntimeError(f"tantivy wrote {self.searcher.num_segments} segments, expected 1")
        self.vectors = np.asarray([a["doc_vector"] for a in docs], dtype=np.float32)
        self.hnsw = Index(ndim=self.vectors.shape[1], metric="cos", dtype="f32",
                          connectivity=16, expansion_add=128, expansion_search=64)
        self.hnsw.add(np.arange(self.n), self.vectors, threads=0)
        holders = {}
        for row, a in enumerate(docs):
            for tag in a.get("tags") or []:
                holders.setdefault(tag, []).append(row)
        self.holders = {t: np.asarray(r) for t, r in holders.items()}
        self.tag_mask = {}
        for tag, rows in self.holders.items():
            m = np.zeros(self.n, dtype=bool)
            m[rows] = True
            self.tag_mask[tag] = m
        self.tag_vectors = {tag: self.vectors[rows] for tag, rows in self.holders.items()
                            if len(rows) <= EXACT_TAG}
        self.build_secs = time.perf_counter() - started

    def lexical(self, text, tag, tuned, k=POOL):
        tantivy = self.tantivy
        words = dict.fromkeys(self.analyzer.analyze(text))
        if tuned:
            words = [w for w in words if self.searcher.doc_freq("text", w) <= FREQUENT * self.n]
        if not words:
            return []
        q = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", w)) for w in words])
        if tag is not None:
            q = tantivy.Query.boolean_query([
                (tantivy.Occur.Must, tantivy.Query.term_query(self.schema, "tags", tag)),
                (tantivy.Occur.Must, q)])
        return [addr.doc for _, addr in self.searcher.search(q, k, count=False).hits]

    def vector(self, qv, tag, tuned, k=POOL):
        np = self.np
        if tag is None:
            return list(self.hnsw.search(qv, k, threads=1).keys)
        if tag not in self.holders:
            return []
        if tuned and tag in self.tag_vectors:
            sims = self.tag_vectors[tag] @ qv
            top = np.argpartition(-sims, k)[:k] if len(sims) > k else np.arange(len(sims))
            top = top[np.argsort(-sims[top])]
            return list(self.holders[tag][top])
        keys = self.hnsw.search(qv, OVERSAMPLE, threads=1).keys
        return list(keys[self.tag_mask[tag][keys]][:k])

    @staticmethod
    def fuse(*rankings, k=10):
        score = {}
        for ranking in rankings:
            for rank, row in enumerate(ranking):
                score[row] = score.get(row, 0.0) + 1.0 / (RRF_K + rank + 1)
        return sorted(score, key=lambda r: -score[r])[:k]

    def query(self, text, qv, tag, tuned):
        return self.fuse(self.lexical(text, tag, tuned), self.vector(qv, tag, tuned))


def expert():
    import numpy as np
    ex = Expert(corpus)
    print(json.dumps({"system": "expert tantivy+usearch+RRF", "agents": n, "build_secs": ex.build_secs}),
          flush=True)
    vecs = [np.asarray(q["vector"], dtype=np.float32) for q in queries]
    for q, v in zip(queries, vecs):
        q["_v"] = v
    for tuned, name in ((False, "expert tantivy+usearch+RRF"), (True, "expert tantivy+usearch+RRF, tuned")):
        def one(qr, state, tuned=tuned):
            ex.query(qr["text"], qr["_v"], qr["tag"], tuned)
        one(queries[0], {})  # loads the index's pages once, untimed
        for cl in clients:
            measure(name, one, cl)


def rank():
    import numpy as np
    ex = Expert(corpus)
    for q in queries:
        v = np.asarray(q["vector"], dtype=np.float32)
        tag = q.get("tag")
        ids = lambda rows: [ex.ids[r] for r in rows[:10]]
        print(json.dumps({
            "id": q.get("id"),
            "bm25": ids(ex.lexical(q["text"], tag, False)),
            "vector": ids(ex.vector(v, tag, False)),
            "fused": ids(ex.query(q["text"], v, tag, False)),
            "fused_tuned": ids(ex.query(q["text"], v, tag, True)),
        }), flush=True)


if mode == "rank":
    rank()
    sys.exit(0)
peers = {"postgres": postgres, "lancedb": lance, "expert": expert}
for name in mode.split(","):
    f = peers.get(name)
    if f is None:
        print(json.dumps({"system": name, "agents": n, "error": "unknown peer"}), flush=True)
        continue
    try:
        f()
    except Exception as e:  # a peer that cannot run is reported, not fatal
        print(json.dumps({"system": f.__name__, "agents": n, "error": repr(e)}), flush=True)
