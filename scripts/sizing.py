#!/usr/bin/env python3
"""Measures what docs/operations.md quotes for sizing and backups.

Starts a single node on a fresh data directory, registers N agents shaped
like real tool descriptions (the BFCL live_multiple functions of
../shared/bench-data, each with its JSON Schema as an operation's inputs,
varied per copy), then prints: registration rate, the node's resident
memory, the data directory's size, and the time and size of
`agentry snapshot save`, `agentry snapshot restore`, and the restored
node's start until ready.

    python3 scripts/sizing.py [--agents 100000] [--binary PATH]
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
ADMIN = "sizing-admin-key-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, data_dir):
    ports = [free_port() for _ in range(4)]
    env = dict(os.environ, AGENTRY_ADMIN_KEY=ADMIN, AGENTRY_LOG="warn")
    config = data_dir.parent / (data_dir.name + ".toml")
    config.write_text("rate_limits = { enabled = false }\n")
    proc = subprocess.Popen(
        [binary, "serve", "--config", str(config), "--data-dir", str(data_dir),
         "--http-addr", f"127.0.0.1:{ports[0]}", "--grpc-addr", f"127.0.0.1:{ports[1]}",
         "--raft-addr", f"127.0.0.1:{ports[2]}", "--peer-addr", f"127.0.0.1:{ports[3]}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert line.startswith("agentry ready"), line
    return proc, ports


def templates():
    path = ROOT.parent / "shared/bench-data/bfcl-live/agents.jsonl"
    out = []
    for line in path.read_text().splitlines():
        f = json.loads(line)
        out.append(f)
    return out


def record(t, k):
    return {
        "id": "".join(c if c.isalnum() or c in "._~-" else "-" for c in t["id"]) + f"-{k}",
        "name": f"{t['name']} #{k}",
        "description": t["description"],
        "version": "1.0.0",
        "publisher": f"Publisher {k % 97}",
        "tags": ["bfcl", f"group-{k % 50}"],
        "bindings": [{"protocol": "https", "endpoint": f"https://agents.example/{k}/invoke"}],
        "operations": [{"name": "call", "description": t["description"],
                        "inputs": t.get("parameters", {"type": "object"})}],
    }


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def du_bytes(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def register_all(port, n, workers=16):
    ts = templates()
    local = threading.local()

    def post(k):
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps(record(ts[k % len(ts)], k))
        local.conn.request("POST", "/agents", body, {
            "content-type": "application/json", "authorization": f"Bearer {ADMIN}"})
        r = local.conn.getresponse()
        answer = r.read()
        if r.status != 201:
            raise RuntimeError(f"register {k}: {r.status} {answer[:300]}")
        return len(body)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(post, range(n), chunksize=256))


def ready(port, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/readyz")
            r = c.getresponse()
            body = json.loads(r.read() or b"{}")
            if r.status == 200:
                return body
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready")


def indexed(port, n, timeout=1200):
    deadline = time.time() + timeout
    while time.time() < deadline:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        for line in text.splitlines():
            if line.startswith("agentry_discovery_indexed_agents{"):
                if int(line.rsplit(" ", 1)[1]) >= n:
                    return
        time.sleep(0.5)
    raise RuntimeError("index did not catch up")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100_000)
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    ap.add_argument("--binary", default=f"{target}/debug/agentry")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="agentry-sizing-"))
    try:
        data = work / "node"
        proc, ports = start(a.binary, data)
        t0 = time.time()
        payload = register_all(ports[0], a.agents)
        took = time.time() - t0
        print(f"registered {a.agents} agents ({payload / a.agents:.0f} bytes of JSON each) "
              f"in {took:.1f} s ({a.agents / took:.0f}/s, 16 HTTP clients)")
        indexed(ports[0], a.agents)
        time.sleep(3)
        print(f"resident memory with {a.agents} agents indexed: {rss_kib(proc.pid) / 1024:.0f} MiB")
        print(f"data directory: {du_bytes(data) / 2**20:.0f} MiB")
        backup = work / "registry.backup"
        env = dict(os.environ, AGENTRY_API_KEY=ADMIN, AGENTRY_LOG="warn")
        t0 = time.time()
        subprocess.run([a.binary, "snapshot", "save", str(backup), "--server",
                        f"http://127.0.0.1:{ports[1]}"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        print(f"snapshot save (online, over gRPC): {time.time() - t0:.1f} s, "
              f"{backup.stat().st_size / 2**20:.0f} MiB")
        proc.terminate()
        proc.wait(timeout=60)
        restored = work / "restored"
        t0 = time.time()
        subprocess.run([a.binary, "snapshot", "restore", str(backup), "--data-dir",
                        str(restored)], env=env, check=True, stdout=subprocess.DEVNULL)
        print(f"snapshot restore (checksum + load): {time.time() - t0:.1f} s")
        t0 = time.time()
        proc, ports = start(a.binary, restored)
        ready(ports[0])
        indexed(ports[0], a.agents)
        print(f"restored node serving with {a.agents} agents indexed: {time.time() - t0:.1f} s "
              f"after start; data directory {du_bytes(restored) / 2**20:.0f} MiB")
        time.sleep(3)
        print(f"resident memory of the restored node (index built, no writes yet): "
              f"{rss_kib(proc.pid) / 1024:.0f} MiB")
        proc.terminate()
        proc.wait(timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
