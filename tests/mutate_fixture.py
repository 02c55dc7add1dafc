#!/usr/bin/env python3
"""Makes a mutated copy of an official-reference fixture for the gate tests (tests/check_fixture_cpu.cmake).

  mutate_fixture.py SRC DST logit-row K DELTA     logits.f32 row K shifted by DELTA (every entry)
  mutate_fixture.py SRC DST inject FILE ROW REL   inject/FILE row ROW: one element moved by REL x the file's RMS
  mutate_fixture.py SRC DST bf16-row FILE ROW WIDTH REL   a bf16 file (e.g. aligned.bf16) row ROW, the same way
  mutate_fixture.py SRC DST remove RELPATH        a file or folder removed

The checkpoint is linked, not copied. Standard library only."""
import array
import math
import os
import shutil
import struct
import sys


def copy_fixture(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if name == "checkpoint":
            os.symlink(os.path.abspath(s), d)
        elif os.path.isdir(s):
            shutil.copytree(s, d, copy_function=shutil.copyfile)
        else:
            shutil.copyfile(s, d)
    for root, dirs, _ in os.walk(dst):  # shared/ is read-only; the copy must be writable
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(dst, 0o755)


def load_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def save_f32(path, a):
    with open(path, "wb") as f:
        f.write(a.tobytes())


def main():
    src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    copy_fixture(src, dst)
    if kind == "logit-row":
        k, delta = int(sys.argv[4]), float(sys.argv[5])
        path = os.path.join(dst, "logits.f32")
        a = load_f32(path)
        with open(os.path.join(src, "steps.json")) as f:
            import json
            vocab = json.load(f)["vocab"]
        for i in range(k * vocab, (k + 1) * vocab):
            a[i] += delta
        save_f32(path, a)
    elif kind == "inject":
        name, row, rel = sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
        path = os.path.join(dst, "inject", name)
        a = load_f32(path)
        rms = math.sqrt(sum(x * x for x in a) / len(a))
        with open(os.path.join(src, "steps.json")) as f:
            import json
            n = json.load(f)["prompt_len"]
        width = len(a) // n
        a[row * width + width // 3] += rel * rms
        save_f32(path, a)
    elif kind == "bf16-row":
        name, row, width, rel = sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
        path = os.path.join(dst, name)
        with open(path, "rb") as f:
            raw = bytearray(f.read())
        vals = [struct.unpack_from("<f", struct.pack("<I", struct.unpack_from("<H", raw, 2 * i)[0] << 16))[0] for i in range(len(raw) // 2)]
        rms = math.sqrt(sum(x * x for x in vals) / len(vals))
        i = row * width + width // 2
        v = vals[i] + rel * rms
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        struct.pack_into("<H", raw, 2 * i, (bits + 0x8000) >> 16 & 0xFFFF)
        with open(path, "wb") as f:
            f.write(raw)
    elif kind == "remove":
        target = os.path.join(dst, sys.argv[4])
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    else:
        sys.exit("unknown mutation " + kind)


if __name__ == "__main__":
    main()
