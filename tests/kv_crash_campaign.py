#!/usr/bin/env python3
"""Crash campaign for the disk KV cache (issue 21): `flashbox run --kv-cache DIR` killed with SIGKILL
at seeded random moments (during model load, prefill, the checkpoint write, decoding), many times
over one folder. After every kill:
  * `flashbox kv verify DIR` finds no damaged checkpoint (writes are atomic: temp file + rename;
    a killed write leaves at most a temp file, which the next open removes);
and at the end:
  * every prompt restores from the folder (all its tokens cached, or none if its write never
    finished) and prints the same greedy text as a run without the cache;
  * no temp file is left after an open.
Usage: kv_crash_campaign.py FLASHBOX WORKDIR [ROUNDS]
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    flashbox, work = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    rng = random.Random(20261201)  # fixed: the same kill schedule on every run
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model, kv = os.path.join(work, "m"), os.path.join(work, "kv")
    r = run([flashbox, "make-tiny", "--out", model])
    assert r.returncode == 0, f"make-tiny: {r.returncode}\n{r.stderr}"
    prompts = [f"Crash campaign prompt number {i}: the cache must survive a kill" for i in range(2)]
    base = [flashbox, "run", "--model", model, "--max-tokens", "8", "--temperature", "0"]

    # Reference texts without the cache, and the time one cached run takes (the kill window).
    ref = {}
    for p in prompts:
        r = run(base + ["-p", p])
        assert r.returncode == 0, f"reference run: {r.returncode}\n{r.stderr}"
        ref[p] = r.stdout
    t0 = time.monotonic()
    r = run(base + ["-p", prompts[0], "--kv-cache", os.path.join(work, "timing")])
    window = time.monotonic() - t0
    assert r.returncode == 0, r.stderr

    killed = finished = 0
    for i in range(rounds):
        p = prompts[i % len(prompts)]
        proc = subprocess.Popen(base + ["-p", p, "--kv-cache", kv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.1) * window)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        else:
            finished += 1
        proc.wait()
        v = run([flashbox, "kv", "verify", kv])
        # An empty or missing folder is fine (no write finished yet); a damaged file is not.
        assert "DAMAGED" not in v.stdout, f"round {i}: damaged checkpoint after a kill:\n{v.stdout}\n{v.stderr}"
        assert v.returncode == 0 or not os.path.isdir(kv), f"round {i}: kv verify exit {v.returncode}\n{v.stdout}\n{v.stderr}"

    # Pass 1: every prompt runs to completion with the cache (the same text; whatever was cached).
    for p in prompts:
        r = run(base + ["-p", p, "--kv-cache", kv])
        assert r.returncode == 0, f"run after the campaign: {r.returncode}\n{r.stderr}"
        assert r.stdout == ref[p], f"text changed after the campaign for {p!r}:\n[{r.stdout}]\n[{ref[p]}]"
    left = [f for f in os.listdir(kv) if ".tmp." in f]
    assert not left, f"temp files left after an open: {left}"
    # Pass 2: each prompt now restores whole and prints the same text.
    restored = 0
    for p in prompts:
        r = run(base + ["-p", p, "--kv-cache", kv])
        assert r.returncode == 0 and r.stdout == ref[p], f"restore of {p!r}: exit {r.returncode}\n[{r.stdout}]\n{r.stderr}"
        m = re.search(r"\[(\d+) prompt tokens \((\d+) cached\)", r.stderr)
        assert m, f"no prompt/cached line in:\n{r.stderr}"
        restored += m.group(1) == m.group(2)
    assert restored == len(prompts), f"only {restored} of {len(prompts)} prompts restored whole"
    print(f"kv crash campaign: {rounds} rounds, {killed} killed, {finished} finished before the kill; "
          f"kill window {window:.2f} s; every checkpoint verified; {restored}/{len(prompts)} prompts restore whole with the same text")


if __name__ == "__main__":
    main()
