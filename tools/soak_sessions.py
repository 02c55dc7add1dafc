#!/usr/bin/env python3
"""Soak test of several sessions at once (issue 20), run by hand: `flashbox serve` on a make-tiny
model, N client threads streaming chat completions for D seconds with random prompt lengths, random
max_tokens and random cancellations (the client closes the stream after a few chunks); the server's
resident memory is sampled every few seconds. Passes when no request fails other than with 429, the
server is alive at the end, and the RSS of the last minute is within 10% of the second minute's
(the first minute warms caches and pools).
Usage: tools/soak_sessions.py FLASHBOX [--seconds 600] [--sessions 16] [--seed 1]
Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = "the cache keeps every prompt token of a session while agents write code and tests run".split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("flashbox")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fb_soak_")
    model = os.path.join(work, "m")
    r = subprocess.run([a.flashbox, "make-tiny", "--out", model], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("make-tiny failed: " + r.stderr)
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    srv = subprocess.Popen([a.flashbox, "serve", "--model", model, "--port", str(port), "--api-key", "k", "--max-sessions", str(a.sessions)],
                           stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("server did not start")

    stats = {"done": 0, "cancelled": 0, "rejected": 0, "failed": 0, "tokens": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + a.seconds
    failures = []

    def worker(k):
        rng = random.Random(a.seed * 1000 + k)
        while time.monotonic() < deadline:
            n = rng.randint(3, 150)
            prompt = " ".join(rng.choice(WORDS) for _ in range(n))
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True,
                               "max_tokens": rng.randint(1, 64), "temperature": rng.choice([0, 0.7, 1.0])})
            cancel_after = rng.randint(1, 6) if rng.random() < 0.25 else None
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
                c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "Authorization": "Bearer k"})
                resp = c.getresponse()
                if resp.status == 429:
                    resp.read()
                    with lock:
                        stats["rejected"] += 1
                    time.sleep(float(resp.getheader("Retry-After", "1")))
                    continue
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
                chunks = 0
                for line in resp:
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        chunks += 1
                        if cancel_after and chunks >= cancel_after:
                            break
                c.close()
                with lock:
                    stats["cancelled" if cancel_after and chunks >= cancel_after else "done"] += 1
                    stats["tokens"] += chunks
            except Exception as e:  # noqa: BLE001 - recorded and reported
                with lock:
                    stats["failed"] += 1
                    failures.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(a.sessions)]
    for t in threads:
        t.start()
    samples = []  # (seconds since start, RSS KiB)
    t0 = time.monotonic()
    while any(t.is_alive() for t in threads):
        if srv.poll() is not None:
            break
        samples.append((time.monotonic() - t0, rss_kib(srv.pid)))
        time.sleep(5)
    for t in threads:
        t.join()
    alive = srv.poll() is None
    srv.terminate()
    srv.wait(30)
    second = [r for s, r in samples if 60 <= s < 120] or [r for _, r in samples[: max(1, len(samples) // 4)]]
    last = [r for s, r in samples if s >= samples[-1][0] - 60] if samples else [0]
    m2, ml = statistics.median(second), statistics.median(last)
    growth = (ml - m2) / m2 if m2 else 0.0
    print(f"soak: {a.seconds:.0f} s, {a.sessions} sessions: {stats['done']} completed, {stats['cancelled']} cancelled, "
          f"{stats['rejected']} answered 429, {stats['failed']} failed, {stats['tokens']} streamed chunks")
    print(f"soak: server RSS median {m2 / 1024:.1f} MiB in the second minute, {ml / 1024:.1f} MiB in the last minute "
          f"({growth * 100:+.1f}%), max {max(r for _, r in samples) / 1024:.1f} MiB; server alive at the end: {alive}")
    for f in failures[:5]:
        print("  failure:", f)
    shutil.rmtree(work, ignore_errors=True)
    ok = alive and stats["failed"] == 0 and growth <= 0.10
    print("soak:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
