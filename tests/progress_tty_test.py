#!/usr/bin/env python3
"""Progress lines on a terminal, nothing on a pipe (issue 24).

Runs the real binary with stderr on a pseudo-terminal (python pty) for `make-tiny`, `convert` and
`run` on the tiny model, and checks that the progress lines appear (make-tiny's bytes and tensors,
convert's experts, its replica copy in bytes and each copy's validation, the weights read in at
load, the prefill of a long prompt, erased before the answer), then runs the same commands with stderr on a pipe and checks that stderr holds exactly
the lines it held before progress existed: no carriage returns, no escape codes, no phase lines.

usage: progress_tty_test.py FLASHBOX WORKDIR
"""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

FAILS = []


def check(cond, what, text=""):
    if not cond:
        FAILS.append(what)
        print(f"FAIL: {what}\n--- stderr ---\n{text!r}\n", flush=True)
    else:
        print(f"ok: {what}", flush=True)


def env():
    e = dict(os.environ)
    return e


def run_pty(args):
    """stderr on a pseudo-terminal, stdout on a pipe. Returns (rc, stdout, stderr, seconds)."""
    master, slave = os.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env())
    os.close(slave)
    chunks = []

    def reader():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not b:
                break
            chunks.append(b)

    th = threading.Thread(target=reader)
    th.start()
    out = p.stdout.read()
    rc = p.wait(timeout=600)
    th.join(timeout=30)
    os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")  # the tty's ONLCR
    return rc, out.decode("utf-8", "replace"), err, time.monotonic() - t0


def run_pipe(args):
    p = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, env=env(), timeout=600)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def no_terminal_codes(err):
    return "\r" not in err and "\x1b" not in err


def main():
    fb, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tm_tty, tm_pipe = os.path.join(work, "tm-tty"), os.path.join(work, "tm-pipe")

    # make-tiny: bytes and tensors, then the final line.
    rc, out, err, _ = run_pty([fb, "make-tiny", "--out", tm_tty])
    check(rc == 0, "make-tiny under a terminal exits 0", err)
    final = re.search(r"\rmake-tiny: ([\d.]+) MB in [\d.]+ s \([\d.]+ [kMG]?B/s\), (\d+) tensors\x1b\[K\n", err)
    check(final is not None, "make-tiny: final line with MB, time, rate and tensors", err)
    if final:
        n_written = re.search(r"wrote \S+: (\d+) tensors", out)
        check(n_written is not None and n_written.group(1) == final.group(2), "make-tiny: the progress counts every tensor written", out)
    for m in re.finditer(r"\rmake-tiny: ([\d.]+)/([\d.]+) MB \((\d+)%\)[^\r\n]*?\x1b\[K", err):
        check(float(m.group(1)) <= float(m.group(2)) and 0 <= int(m.group(3)) <= 100, "make-tiny: an update line is consistent", m.group(0))

    rc, out, err = run_pipe([fb, "make-tiny", "--out", tm_pipe])
    check(rc == 0, "make-tiny on a pipe exits 0", err)
    check(err == f"make-tiny: writing {tm_pipe} (seed 0)...\n", "make-tiny on a pipe: stderr holds only its one line", err)

    # convert: experts, then the replica's copy (bytes) and each copy's validation (experts).
    store, rep = os.path.join(work, "store-tty"), os.path.join(work, "store-tty-rep")
    rc, out, err, _ = run_pty([fb, "convert", "--model", tm_tty, "--out", store, "--replicas", rep])
    check(rc == 0, "convert under a terminal exits 0", err)
    final = re.search(r"\rconvert: (\d+) experts in [\d.]+ s \([\d.]+ experts/s\)\x1b\[K\n", err)
    check(final is not None, "convert: final line with experts, time and rate", err)
    copy = re.search(r"\rcopy to " + re.escape(rep) + r": ([\d.]+) ([kMG]?B) in [\d.]+ s \([\d.]+ [kMG]?B/s\)\x1b\[K\n", err)
    check(copy is not None, "convert: the replica copy's final line with bytes, time and rate", err)
    if copy:
        size = os.path.getsize(os.path.join(rep, "experts.fbx"))
        scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[copy.group(2)]
        check(abs(float(copy.group(1)) * scale - size) <= 0.01 * size, "convert: the copy line counts the whole file", err)
    for d in (store, rep):
        v = re.search(r"\rvalidate " + re.escape(d) + r": (\d+) experts in [\d.]+ s", err)
        check(v is not None and final is not None and v.group(1) == final.group(1),
              f"convert: the validation of {os.path.basename(d)} has a final line with every expert", err)
    order = [err.find("\rconvert: "), err.find("\rcopy to "), err.find("\rvalidate " + store), err.find("\rvalidate " + rep)]
    check(-1 not in order and order == sorted(order), "convert: the phases' lines come in order (write, copy, validate each)", err)
    rc, out, err = run_pipe([fb, "convert", "--model", tm_tty, "--out", os.path.join(work, "store-pipe"),
                             "--replicas", os.path.join(work, "store-pipe-rep")])
    check(rc == 0 and err == "", "convert with a replica on a pipe: nothing on stderr", err)

    # run: the weights read in at load, and the prefill of a long prompt (erased before the answer).
    prompt = " ".join(f"word{i}" for i in range(300))
    args = [fb, "run", "--model", tm_tty, "-p", prompt, "--max-tokens", "2", "--temperature", "0", "--prefill-chunk", "64"]
    rc, out, err, secs = run_pty(args)
    check(rc == 0, "run under a terminal exits 0", err)
    check(re.search(r"\rload weights: [\d.]+ MB in [\d.]+ s \([\d.]+ [kMG]?B/s\), \d+ tensors\x1b\[K\n", err) is not None,
          "run: load weights final line with MB, time, rate and tensors", err)
    pre = re.findall(r"\rprefill: (\d+)/(\d+) tokens \(\d+%\)[^\r\n]*?\x1b\[K", err)
    if pre:
        check(all(int(d) <= int(t) for d, t in pre), "run: prefill lines count tokens up to the prompt", err)
        check("\r\x1b[K" in err[err.rfind("\rprefill: "):], "run: the prefill line is erased before the answer", err)
    else:
        # The first line is drawn 0.1 s into the prefill; a run this long spent that in prefill.
        check(secs < 2.0, f"run: a prefill line appears (run took {secs:.1f} s)", err)
    print(f"note: {len(pre)} prefill line(s) drawn in a {secs:.1f} s run", flush=True)
    stats = re.search(r"\[\d+ prompt tokens \(\d+ cached\), \d+ generated, finish \w+\]\n$", err)
    check(stats is not None, "run under a terminal: the stats line still ends stderr", err)

    rc, out, err = run_pipe(args)
    check(rc == 0, "run on a pipe exits 0", err)
    check(no_terminal_codes(err) and "load weights" not in err and "prefill:" not in err,
          "run on a pipe: no progress text, carriage return or escape code on stderr", err)
    check(re.fullmatch(r"\[\d+ prompt tokens \(0 cached\), 2 generated, finish length\]\n", err) is not None,
          "run on a pipe: stderr is the stats line alone", err)

    if FAILS:
        print(f"{len(FAILS)} check(s) failed", flush=True)
        return 1
    print("progress_tty_test: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
