#!/usr/bin/env python3
"""A soak of `rocmforge serve` (issue 26): C client threads, for a bounded time, send a random
mix of whole and streamed completions and chats, streams they hang up on after a few chunks,
and malformed requests; then, with the load stopped, the server must be alive and healthy,
every malformed request must have been answered 4xx, no request 5xx, and the KV cache's blocks
all back (`rocmforge_kv_blocks_used 0` in /metrics). Standard library only; loopback only.

    python3 benches/serve_soak.py --server "rocmforge serve --model M.gguf --port 18090" \\
        --url http://127.0.0.1:18090 [--seconds 600] [--concurrency 16] [--seed 1]

Prints the counts and exits 0 when every check holds, 1 otherwise.
"""
import argparse
import http.client
import json
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

# (what, body, the status it must get): each a request a client may send by mistake.
BAD = [
    ("malformed JSON", b'{"prompt": "x",', 400),
    ("a JSON array", b"[]", 400),
    ("prompt of the wrong type", json.dumps({"prompt": 5}).encode(), 400),
    ("max_tokens negative", json.dumps({"prompt": "x", "max_tokens": -3}).encode(), 400),
    ("max_tokens absurd", json.dumps({"prompt": "x", "max_tokens": 10 ** 12}).encode(), 400),
    ("n = 3", json.dumps({"prompt": "x", "n": 3}).encode(), 400),
    ("unknown model", json.dumps({"prompt": "x", "model": "no-such-model"}).encode(), 400),
    ("temperature out of range", json.dumps({"prompt": "x", "temperature": 9}).encode(), 400),
    ("stop of the wrong type", json.dumps({"prompt": "x", "stop": [1]}).encode(), 400),
    ("a prompt past the context", json.dumps({"prompt": "hello " * 5000}).encode(), 400),
]


def request(host, port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server (loopback only)")
    ap.add_argument("--server", help="start this command first and stop it at the end")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("error: only loopback URLs: this soaks a local server")
    host, port = u.hostname, u.port
    proc = None
    if a.server:
        proc = subprocess.Popen(shlex.split(a.server), stdout=subprocess.DEVNULL,
                                stderr=open("/tmp/serve_soak.log", "w"), start_new_session=True)
    deadline = time.time() + 600
    while True:
        try:
            _, r = request(host, port, "GET", "/health", timeout=2)
            if r.status == 200:
                break
        except OSError:
            pass
        if proc and proc.poll() is not None or time.time() > deadline:
            sys.exit("error: the server did not come up (log: /tmp/serve_soak.log)")
        time.sleep(0.5)
    _, r = request(host, port, "GET", "/v1/models")
    model = json.loads(r.read())["data"][0]["id"]

    counts = {}
    problems = []
    lock = threading.Lock()
    words = "the cat sat on a mat and the dog ran to the park while it rained".split()

    def note(key, problem=None):
        with lock:
            counts[key] = counts.get(key, 0) + 1
            if problem and len(problems) < 20:
                problems.append(problem)

    def client(i):
        rng = random.Random(a.seed * 1000 + i)
        end = time.time() + a.seconds
        while time.time() < end:
            kind = rng.choice(["whole", "stream", "chat", "hangup", "hangup", "bad", "bad"])
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
            body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, a.max_tokens),
                    "temperature": rng.choice([0, 0, 0.8]), "seed": rng.randint(0, 99)}
            try:
                if kind == "bad":
                    what, raw, status = rng.choice(BAD)
                    c, r = request(host, port, "POST", "/v1/completions", raw)
                    r.read()
                    c.close()
                    ok = r.status == status
                    note("bad ok" if ok else "bad wrong",
                         None if ok else f"{what}: {r.status}, expected {status}")
                    continue
                path = "/v1/completions"
                if kind == "chat":
                    path = "/v1/chat/completions"
                    body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
                if kind in ("stream", "hangup"):
                    body["stream"] = True
                c, r = request(host, port, "POST", path, json.dumps(body).encode())
                if r.status == 429:
                    r.read()
                    c.close()
                    note("429")
                    continue
                if r.status != 200:
                    note("failed", f"{kind}: status {r.status}: {r.read()[:200]!r}")
                    c.close()
                    continue
                if kind == "hangup":
                    # Read a chunk or two of the stream, then hang up mid-way.
                    for _ in range(rng.randint(0, 2)):
                        if not r.fp.readline():
                            break
                    c.close()
                    note("hung up")
                    continue
                data = r.read()
                c.close()
                if b'"error"' in data and kind != "stream":
                    note("failed", f"{kind}: {data[:200]!r}")
                else:
                    note(kind)
            except (OSError, http.client.HTTPException) as e:
                note("failed", f"{kind}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(a.concurrency)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=a.seconds + 120)
    wall = time.time() - t0
    # The hang-ups' requests end at their next token: give them a moment, then look.
    used = None
    for _ in range(40):
        _, r = request(host, port, "GET", "/metrics")
        text = r.read().decode()
        metrics = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, v = line.rpartition(" ")
                metrics[name] = float(v)
        used = metrics.get("rocmforge_kv_blocks_used")
        if used == 0 and metrics.get("rocmforge_requests_running", 0) == 0:
            break
        time.sleep(0.25)
    errors_5xx = sum(v for k, v in metrics.items()
                     if k.startswith("rocmforge_requests_total") and 'status="5' in k)
    alive = proc is None or proc.poll() is None
    _, r = request(host, port, "GET", "/health")
    healthy = r.status == 200
    print(f"soak: {wall:.0f} s, {a.concurrency} clients; " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    jobs = {o: metrics.get('rocmforge_jobs_total{outcome="%s"}' % o)
            for o in ("completed", "cancelled", "failed")}
    print(f"server alive {alive}, healthy {healthy}; 5xx answered {errors_5xx:.0f}; "
          f"KV blocks used at rest {used} of {metrics.get('rocmforge_kv_blocks_total')}; "
          f"jobs {jobs}; preemptions {metrics.get('rocmforge_preemptions_total')}")
    for p in problems:
        print("  problem:", p)
    failed_jobs = metrics.get('rocmforge_jobs_total{outcome="failed"}', 0)
    ok = (alive and healthy and errors_5xx == 0 and used == 0 and counts.get("bad wrong", 0) == 0
          and counts.get("failed", 0) == 0 and failed_jobs == 0)
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("soak:", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
