#!/usr/bin/env python3
"""tools/plot_bench.py on the committed CSVs (docs/bench) into a temporary folder: every plot is
written, is a real PNG of a sensible size with more than a blank canvas in it, and docs/plots has
the same files (docs/results.md links them). A bench folder missing a CSV must fail, not plot
nothing. Needs matplotlib (tools/test.sh installs it into build/pyenv; the test fails without it).
"""
import os, shutil, struct, subprocess, sys, tempfile, zlib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PLOTS = ["decode_ms_vs_context.png", "verify_cost_vs_rows.png", "dspark_tok_s_vs_accept.png", "tiers_vs_skew.png",
         "prefill_tok_s_vs_context.png"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def png_info(path):
    """(width, height, distinct byte values in the decompressed pixel data)."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + " is not a PNG")
    w, h = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    return w, h, len(set(zlib.decompress(idat)))


def run(args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_bench.py")] + args, capture_output=True, text=True)


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("matplotlib is missing (tools/test.sh installs it into build/pyenv)")
    tmp = tempfile.mkdtemp(prefix="fb_plots_")
    try:
        out = os.path.join(tmp, "plots")
        r = run(["--bench", os.path.join(ROOT, "docs", "bench"), "--out", out])
        if r.returncode != 0:
            fail("plot_bench.py exited %d: %s" % (r.returncode, r.stderr))
        for name in PLOTS:
            p = os.path.join(out, name)
            if not os.path.exists(p):
                fail(name + " was not written")
            w, h, distinct = png_info(p)
            if w < 600 or h < 400 or os.path.getsize(p) < 20000 or distinct < 32:
                fail(f"{name}: {w}x{h}, {os.path.getsize(p)} bytes, {distinct} distinct byte values: looks empty")
            if not os.path.exists(os.path.join(ROOT, "docs", "plots", name)):
                fail(f"docs/plots/{name} is not committed (run tools/plot_bench.py)")
        # A missing input is an error.
        partial = os.path.join(tmp, "bench")
        shutil.copytree(os.path.join(ROOT, "docs", "bench"), partial)
        os.remove(os.path.join(partial, "h200-tiers-fast-s6-1611053.csv"))
        r = run(["--bench", partial, "--out", os.path.join(tmp, "p2")])
        if r.returncode == 0 or "h200-tiers-fast-s6-1611053.csv" not in r.stderr:
            fail("a missing CSV did not fail the run: " + r.stderr)
        print(f"PASS: {len(PLOTS)} plots")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
