#!/usr/bin/env python3
"""Print NumPy's own Generator(PCG64) output as test vectors for src/model/numpy_rng.cpp.

Output format (one record per line, '#' lines are comments):
  # numpy <version>
  S <seed> <w0> ... <w7>                 SeedSequence(seed).generate_state(8, uint32)
  P <seed> <state_hi> <state_lo> <inc_hi> <inc_lo> <u64_0> <u64_1> <u64_2> <u32_0> <u32_1> <u32_2>
                                          PCG64(seed) state after seeding, then 3 random_raw()
                                          values from a fresh PCG64(seed), then 3 next_uint32 draws
                                          from another fresh one (integers(0, 2**32, dtype=int64))
  I <seed> <low> <high> <n> <v_0> ... <v_{n-1}>
                                          default_rng(seed).integers(low, high, size=n, dtype=int64)

Usage:
  gen_numpy_rng_golden.py                 fixed golden cases (src/model/testdata/numpy_rng_golden.txt)
  gen_numpy_rng_golden.py --random N [--rng-seed S]
                                          N fresh random integer cases (used by numpy_rng_test)
"""

import argparse
import random
import sys

import numpy as np

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def seed_state_line(seed):
    words = np.random.SeedSequence(seed).generate_state(8, np.uint32)
    return "S %d %s" % (seed, " ".join(str(int(w)) for w in words))


def pcg_line(seed):
    bg = np.random.PCG64(seed)
    st = bg.state["state"]
    s, inc = int(st["state"]), int(st["inc"])
    raw = [int(v) for v in np.random.PCG64(seed).random_raw(3)]
    # integers(0, 2**32, dtype=int64) takes the rng == 0xFFFFFFFF path: raw next_uint32 draws.
    u32 = [int(v) for v in np.random.Generator(np.random.PCG64(seed)).integers(
        0, 2**32, size=3, dtype=np.int64)]
    vals = [s >> 64, s & (2**64 - 1), inc >> 64, inc & (2**64 - 1)] + raw + u32
    return "P %d %s" % (seed, " ".join(str(v) for v in vals))


def int_line(seed, low, high, n):
    vals = np.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64)
    return "I %d %d %d %d %s" % (seed, low, high, n, " ".join(str(int(v)) for v in vals))


def fixed_cases():
    r = random.Random(20240611)
    seeds = [0, 1, 2, 3, 10007, 140098, 20014, 10007 * 7, 2**31, 2**32 - 1, 2**32, 2**32 + 1,
             2**48 + 12345, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 2, 2**64 - 1]
    seeds += [r.getrandbits(32) for _ in range(4)] + [r.getrandbits(64) for _ in range(4)]
    highs = [1, 2, 3, 5, 1000, 65536, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**33,
             46539438283891, 2**53 + 7, 2**62, 2**62 + 3, 2**63 - 2, 2**63 - 1]
    ns = [1, 4, 7, 33]
    lines = []
    for seed in seeds:
        lines.append(seed_state_line(seed))
        lines.append(pcg_line(seed))
    for seed in seeds:
        for high in highs:
            for n in ns:
                lines.append(int_line(seed, 0, high, n))
    # Non-zero and negative lows (off wraps through uint64 in NumPy).
    lows_highs = [(-5, 5), (-1, 0), (-(2**31), 2**31), (-(2**32), 0), (7, 2**32 + 7),
                  (2**62, 2**62 + 1000), (I64_MIN, I64_MIN + 1), (I64_MIN, 0), (I64_MIN, I64_MAX),
                  (-1, I64_MAX), (I64_MIN, -(2**63) + 2**32), (I64_MAX - 1, I64_MAX),
                  (-123456789012345, 987654321098765)]
    for seed in [0, 1, 10007, 140098, 2**32, 2**64 - 1]:
        for low, high in lows_highs:
            for n in (4, 33):
                lines.append(int_line(seed, low, high, n))
    # Engram multiplier draws for a range of compressed vocab sizes and layer ids.
    for v in [1, 2, 3, 256, 99092, 129280, 2**20, 2**31, 2**40, 2**62, I64_MAX]:
        b = max(1, (I64_MAX // v) // 2)
        for layer in [0, 1, 2, 5, 14, 39, 61]:
            lines.append(int_line(10007 * layer, 0, b, 4))
    return lines


def random_cases(count, rng_seed):
    r = random.Random(rng_seed)
    lines = []
    for _ in range(count):
        kind = r.randrange(4)
        seed = r.choice([r.getrandbits(64), r.getrandbits(32), r.getrandbits(16), 10007 * r.randrange(64)])
        if kind == 0:  # 32-bit path, anywhere in int64
            span = r.randint(1, 2**32)
            low = r.randint(I64_MIN, I64_MAX - span + 1)
        elif kind == 1:  # 64-bit path
            span = r.randint(2**32 + 1, 2**64 - 1)
            low = r.randint(I64_MIN, I64_MAX - span + 1)
        elif kind == 2:  # small ranges starting at 0
            low, span = 0, r.randint(1, 2**r.randint(1, 62))
        else:  # multiplier-like: B = max(1, (I64_MAX // V) // 2)
            low, span = 0, max(1, (I64_MAX // r.randint(1, 2**r.randint(1, 63) - 1)) // 2)
        high = low + span
        n = r.choice([1, 2, 3, 4, 7, 33, 100])
        if r.randrange(8) == 0:
            lines.append(seed_state_line(seed))
            lines.append(pcg_line(seed))
        lines.append(int_line(seed, low, high, n))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", type=int, default=0, help="emit N random cases instead of the fixed set")
    ap.add_argument("--rng-seed", type=int, default=None, help="seed of the case picker (default: fresh)")
    args = ap.parse_args()
    out = ["# numpy %s" % np.__version__,
           "# generated by tools/gen_numpy_rng_golden.py%s" % (" --random" if args.random else "")]
    if args.random:
        rng_seed = args.rng_seed if args.rng_seed is not None else random.SystemRandom().getrandbits(32)
        out.append("# rng-seed %d" % rng_seed)
        out += random_cases(args.random, rng_seed)
    else:
        out += fixed_cases()
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
