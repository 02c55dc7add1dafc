#!/usr/bin/env python3
"""Id-for-id comparison of `fb_tokenize` (flashbox tokenize) with HF `tokenizers`.

Documents: the committed corpus, a fixed-seed generated corpus, a fresh random-seed corpus
(documents nobody has seen; the seed is printed), and source files found on this machine.
Exits 0 on full agreement, 1 on any mismatch or when `tokenizers` is missing (tools/test.sh installs
it into build/pyenv, the interpreter ctest runs this with).

usage: compare_hf.py --bin PATH --tokenizer PATH [--corpus PATH] [--n-random N] [--seed S]
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
    ap.add_argument("--n-random", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("FAIL: python package `tokenizers` is not installed (tools/test.sh installs it into build/pyenv)")
        return 1

    docs = []
    with open(args.corpus, encoding="utf-8") as f:
        docs += [json.loads(line) for line in f if line.strip()]
    fixed = random.Random(12345)
    docs += [make_corpus.document(fixed) for _ in range(args.n_random)]
    seed = args.seed if args.seed is not None else int(time.time()) % 1000003
    print(f"fresh random seed {seed} (rerun with --seed {seed})")
    fresh = random.Random(seed)
    docs += [make_corpus.document(fresh) for _ in range(args.n_random)]
    root = os.path.dirname(os.path.dirname(HERE))
    files = sorted(glob.glob(os.path.join(root, "src", "**", "*.*"), recursive=True))
    files += sorted(glob.glob("/usr/lib/python3*/json/*.py"))[:20]
    for path in files[:200]:
        try:
            with open(path, encoding="utf-8") as f:
                docs.append(f.read())
        except (UnicodeDecodeError, OSError):
            pass

    hf = Tokenizer.from_file(args.tokenizer)
    t0 = time.time()
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    t_hf = time.time() - t0
    payload = "".join(json.dumps(d) + "\n" for d in docs if d != "")
    t0 = time.time()
    res = subprocess.run([args.bin, "--tokenizer", args.tokenizer, "--jsonl"], input=payload.encode(),
                         capture_output=True, check=False)
    t_ours = time.time() - t0
    if res.returncode != 0:
        print("fb_tokenize failed:", res.stderr.decode(errors="replace"))
        return 1
    got_lines = res.stdout.decode().split("\n")
    bad = 0
    k = 0
    for d, w in zip(docs, want):
        if d == "":
            continue
        got = [int(x) for x in got_lines[k].split()]
        k += 1
        if got != w:
            bad += 1
            if bad <= 5:
                i = next((i for i, (a, b) in enumerate(zip(got, w)) if a != b), min(len(got), len(w)))
                print(f"MISMATCH doc {json.dumps(d[:200])}...\n  first diff at {i}: ours {got[i:i+8]} hf {w[i:i+8]}"
                      f"\n  hf tokens {[hf.id_to_token(x) for x in w[max(0,i-2):i+6]]}")
    # The exact CLI interface on a few documents: stdin text -> ids; ids -> text (HF decode).
    for d in docs[:6] + docs[-4:]:
        r = subprocess.run([args.bin, "--tokenizer", args.tokenizer], input=d.encode(), capture_output=True)
        ids = [int(x) for x in r.stdout.split()]
        if ids != hf.encode(d, add_special_tokens=False).ids:
            bad += 1
            print(f"CLI MISMATCH on {json.dumps(d[:80])}")
        r = subprocess.run([args.bin, "--tokenizer", args.tokenizer, "--decode"],
                           input=" ".join(map(str, ids)).encode(), capture_output=True)
        if r.stdout.decode() != hf.decode(ids, skip_special_tokens=False):
            bad += 1
            print(f"DECODE MISMATCH on {json.dumps(d[:80])}")
    n_bytes = sum(len(d.encode()) for d in docs)
    print(f"{len(docs)} documents, {n_bytes / 1e6:.2f} MB, {sum(map(len, want))} tokens; "
          f"HF batch {t_hf:.2f}s, fb_tokenize (incl. load) {t_ours:.2f}s; mismatches: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
