#!/usr/bin/env python3
"""A load generator for OpenAI-compatible servers on this machine: `rocmforge serve` and
llama.cpp's `llama-server`, side by side in one run. Standard library only (the GPU machine has
Python 3 but no pip downloads).

For each concurrency C (default 1, 8, 32, 64) and prompt length P (default ~128 and ~512
tokens), C client threads each send streamed greedy completions (`max_tokens` N, default 128)
one after another until R requests (default 2·C) are done or the level's time limit passes.
Per level: output tokens per second over the level's wall time (all clients together); at p50
and p99: time to first token, time per output token after the first (TPOT: a request's decode
time over its tokens) and inter-token latency (ITL: the gaps between content chunks, as a reader
of the stream sees them); and the requests that failed. The token
count of a request is the server's `usage.completion_tokens` (asked for with
`stream_options.include_usage`), else the number of content chunks.

    python3 benches/serve_load.py --url ours=http://127.0.0.1:8080 \\
        --url llama.cpp=http://127.0.0.1:8081 [--concurrency 1,8,32,64] [--json out.json]

Or start the servers itself (each command must serve on the URL's port; the script waits for
GET /health, runs, and stops them with SIGTERM):

    python3 benches/serve_load.py \\
        --server ours=http://127.0.0.1:8080 'rocmforge serve --model M.gguf --port 8080' \\
        --server llama.cpp=http://127.0.0.1:8081 'llama-server -m M.gguf --port 8081 -np 64 -fa on -ngl 99'

Only loopback URLs are accepted: this is a bench, not a load test of someone else's server.
Bounded in requests and time by construction (--requests, --level-seconds).
"""
import argparse
import http.client
import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

# Words whose greedy continuation runs long on small chat models; repeated to the prompt's
# length. About one token a word for LLaMA-family tokenizers (the table prints the server's
# own prompt token count).
FILLER = ("the history of the river valley and the towns along its banks is long and "
          "varied, shaped by trade, weather and the people who settled there").split()


def prompt_of(words):
    out = []
    while len(out) < words:
        out.extend(FILLER)
    return " ".join(out[:words]) + ". Tell me more about it:"


def loopback_url(url):
    """(host, port, base path) of a loopback http URL; exits otherwise."""
    u = urllib.parse.urlparse(url)
    if u.scheme != "http" or not u.hostname:
        sys.exit(f"error: {url}: expected http://HOST:PORT")
    try:
        infos = socket.getaddrinfo(u.hostname, u.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        sys.exit(f"error: {url}: {e}")
    if not all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos):
        sys.exit(f"error: {url} is not a loopback address; this bench only loads local servers")
    return u.hostname, u.port or 80, u.path.rstrip("/")


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(target, body, timeout, api_key):
    """Sends one streamed completion; returns a dict of timings or raises."""
    host, port, base = target
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    conn.request("POST", base + "/v1/completions", body=json.dumps(body), headers=headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    stamps, usage = [], None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        v = json.loads(data)
        if "error" in v:
            raise RuntimeError(f"error event: {v['error']}")
        if v.get("usage"):
            usage = v["usage"]
        for c in v.get("choices") or []:
            if c.get("text"):
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    conn.close()
    tokens = (usage or {}).get("completion_tokens") or len(stamps)
    return {
        "start": t0,
        "end": end,
        "ttft": (stamps[0] - t0) if stamps else None,
        # Gaps between content chunks; a chunk may carry more than one token (held-back
        # UTF-8, llama-server's batching of pieces), so this is per chunk, which is what a
        # reader of the stream sees.
        "itl": [b - a for a, b in zip(stamps, stamps[1:])],
        "tokens": tokens,
        # Time per output token after the first (vLLM's TPOT): the decode rate a client sees,
        # whatever the chunking.
        "tpot": ((stamps[-1] - stamps[0]) / (tokens - 1)) if stamps and tokens > 1 else None,
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
    }


def run_level(target, conc, prompt_words, max_tokens, requests, seconds, timeout, api_key, model,
              ignore_eos=True):
    body = {"prompt": prompt_of(prompt_words), "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        # Every request generates max_tokens (vLLM's and llama-server's `ignore_eos`): the
        # output length is the bench's, not where the model's greedy text happens to end.
        body["ignore_eos"] = True
    if model:
        body["model"] = model
    lock = threading.Lock()
    results, failures = [], []
    issued = [0]
    deadline = time.perf_counter() + seconds

    def client():
        while True:
            with lock:
                if issued[0] >= requests or time.perf_counter() > deadline:
                    return
                issued[0] += 1
            try:
                r = one_request(target, body, timeout, api_key)
                with lock:
                    results.append(r)
            except Exception as e:  # a failed request is counted, the level goes on
                with lock:
                    failures.append(str(e)[:200])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + timeout + 5)
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [x for r in results for x in r["itl"]]
    tpot = [r["tpot"] for r in results if r["tpot"] is not None]
    prompt_tokens = [r["prompt_tokens"] for r in results if r["prompt_tokens"]]
    return {
        "concurrency": conc,
        "prompt_words": prompt_words,
        "prompt_tokens": max(prompt_tokens) if prompt_tokens else None,
        "requests": len(results),
        "failed": len(failures),
        "failures": failures[:3],
        "tokens": tokens,
        "tokens_per_request": tokens / len(results) if results else 0.0,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50),
        "itl_p99_ms": 1e3 * percentile(itl, 99),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
    }


def wait_healthy(target, seconds, proc=None, log=None):
    host, port, base = target
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = open(log).read()[-2000:] if log else ""
            sys.exit(f"error: the server exited with {proc.returncode} before it was healthy"
                     f"{'; its log (' + log + ') ends:' + chr(10) + tail if tail else ''}")
        try:
            c = http.client.HTTPConnection(host, port, timeout=2)
            c.request("GET", base + "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"error: http://{host}:{port}{base}/health did not answer 200 within {seconds} s")


def served_model(target, api_key):
    """The first model id GET /v1/models lists (what `model` names in the requests)."""
    host, port, base = target
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", base + "/v1/models",
              headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"error: GET /v1/models answered {r.status}")
    return json.loads(r.read())["data"][0]["id"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                    help="a running server to load (repeatable)")
    ap.add_argument("--server", action="append", nargs=2, default=[],
                    metavar=("NAME=URL", "COMMAND"),
                    help="start COMMAND, wait for URL/health, load it, stop it (repeatable)")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--prompt-words", default="128,512",
                    help="prompt lengths in words (~tokens); the table prints the token count")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="let requests end at EOS (default: ignore_eos, every request generates "
                         "--max-tokens; a server without ignore_eos shows fewer tokens/req)")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per level (default: 2 x concurrency, at least 4)")
    ap.add_argument("--level-seconds", type=float, default=120.0,
                    help="no new request after this many seconds of a level")
    ap.add_argument("--timeout", type=float, default=300.0, help="per request")
    ap.add_argument("--warmup", type=int, default=2, help="sequential requests before the levels")
    ap.add_argument("--api-key", default=os.environ.get("ROCMFORGE_API_KEY"))
    ap.add_argument("--model", default=None,
                    help="the request's `model` field (default: the first of GET /v1/models)")
    ap.add_argument("--startup-seconds", type=float, default=600.0)
    ap.add_argument("--json", default=None, help="also write every row here")
    a = ap.parse_args()

    def named(spec):
        if "=" not in spec:
            sys.exit(f"error: {spec}: expected NAME=URL")
        name, url = spec.split("=", 1)
        return name, loopback_url(url)

    levels = [int(x) for x in a.concurrency.split(",") if x]
    prompts = [int(x) for x in a.prompt_words.split(",") if x]
    if any(c < 1 or c > 256 for c in levels):
        sys.exit("error: concurrency must be 1..256")
    jobs = [(*named(u), None) for u in a.url] + [(*named(s), cmd) for s, cmd in a.server]
    if not jobs:
        sys.exit("error: give at least one --url or --server")

    rows = []
    for name, target, cmd in jobs:
        proc, log = None, None
        if cmd:
            log = os.path.join(tempfile.gettempdir(), f"serve_load.{name}.log")
            print(f"$ {cmd}   (log: {log})", file=sys.stderr)
            proc = subprocess.Popen(shlex.split(cmd), stdout=subprocess.DEVNULL,
                                    stderr=open(log, "w"), start_new_session=True)
        try:
            wait_healthy(target, a.startup_seconds, proc, log)
            model = a.model or served_model(target, a.api_key)
            for _ in range(a.warmup):
                one_request(target, {"model": model, "prompt": prompt_of(16), "max_tokens": 8,
                                     "temperature": 0, "stream": True}, a.timeout, a.api_key)
            for p in prompts:
                # The server's first request at a prompt length may compile a plan for it (our
                # prompt buckets): outside the levels.
                one_request(target, {"model": model, "prompt": prompt_of(p), "max_tokens": 8,
                                     "temperature": 0, "stream": True}, a.timeout, a.api_key)
                for c in levels:
                    n = a.requests or max(4, 2 * c)
                    r = run_level(target, c, p, a.max_tokens, n, a.level_seconds, a.timeout,
                                  a.api_key, model, ignore_eos=not a.stop_at_eos)
                    r["server"] = name
                    rows.append(r)
                    print(f"{name:>10} P~{p:<4} C={c:<3} {r['tokens_per_s']:9.1f} tok/s  "
                          f"ttft p50 {r['ttft_p50_ms']:8.1f} ms  tpot p50 {r['tpot_p50_ms']:6.2f} "
                          f"itl p99 {r['itl_p99_ms']:7.2f} ms  ({r['requests']} ok, "
                          f"{r['failed']} failed)", file=sys.stderr, flush=True)
        finally:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

    names = [j[0] for j in jobs]
    print("| server | prompt tokens | concurrency | tokens/req | tokens/s | TTFT p50 / p99 ms | "
          "TPOT p50 / p99 ms | ITL p50 / p99 ms | ok / failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['prompt_tokens'] or '~' + str(r['prompt_words'])} | "
              f"{r['concurrency']} | {r['tokens_per_request']:.0f} | "
              f"{r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.1f} / "
              f"{r['ttft_p99_ms']:.1f} | {r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
              f"{r['itl_p50_ms']:.2f} / {r['itl_p99_ms']:.2f} | "
              f"{r['requests']} / {r['failed']} |")
    if len(names) > 1:
        print()
        print(f"| prompt | concurrency | " + " | ".join(f"{n} / {names[-1]}" for n in names[:-1])
              + " (throughput ratio) |")
        print("|---|---|" + "---|" * (len(names) - 1))
        key = {(r["server"], r["prompt_words"], r["concurrency"]): r for r in rows}
        for p in prompts:
            for c in levels:
                base = key.get((names[-1], p, c))
                cells = []
                for n in names[:-1]:
                    r = key.get((n, p, c))
                    ok = r and base and base["tokens_per_s"] > 0
                    cells.append(f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if ok else "-")
                print(f"| ~{p} | {c} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "max_tokens": a.max_tokens}, f, indent=1)


if __name__ == "__main__":
    main()
