#!/usr/bin/env python3
"""Times the two stores an operator would pick instead of Agentry, on the
corpus and query vectors `agentry bench discover --peers` wrote to DIR:

- PostgreSQL 15: the lexical + tag part (tsvector with a GIN index,
  ts_rank, tag filter on a GIN-indexed text[]), over a Unix socket;
- LanceDB (embedded, Rust core): the full hybrid query (full-text + vector
  + tag prefilter), in-process.

Usage: bench-peers.py DIR PG_BIN_DIR CLIENTS(comma-separated)
Prints one JSON object per measured run on stdout.
"""
import json, os, shutil, subprocess, sys, tempfile, threading, time

d, pg_bin, clients = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")]
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


for f in (postgres, lance):
    try:
        f()
    except Exception as e:  # a peer that cannot run is reported, not fatal
        print(json.dumps({"system": f.__name__, "agents": n, "error": repr(e)}), flush=True)
