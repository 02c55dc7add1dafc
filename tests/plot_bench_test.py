#!/usr/bin/env python3
"""tools/plot_bench.py on the committed CSVs (docs/bench) into a temporary folder: every plot is
written, is a real PNG of a sensible size with more than a blank canvas in it, and docs/plots has
the same files (docs/results.md links them). The figures themselves, drawn in this process: every
axes has a title or a figure title, an x label, a y label with its unit in parentheses, a legend,
and lines whose points are the CSV's values (read here with the csv module, not through the
script's reader); the decode plot has one line per session file and the roofline, and its 4K and
128K by-session lines; the verify ratios and the DSpark lines of every session are the CSVs' values. A bench folder
missing a CSV must fail, not plot nothing. Needs matplotlib (tools/test.sh installs it into build/pyenv; the test fails without it).
"""
import csv, importlib.util, os, re, shutil, struct, subprocess, sys, tempfile, zlib

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


def csv_values(path, metric):
    """{context: value} of one metric, read independently of plot_bench.Bench."""
    with open(path, newline="") as f:
        return {int(r["context"]): float(r["value"]) for r in csv.DictReader(f) if r["row"] == metric}


def check_figures(bench_dir):
    """Draws every plot in this process and inspects the matplotlib figures before they close."""
    spec = importlib.util.spec_from_file_location("plot_bench", os.path.join(ROOT, "tools", "plot_bench.py"))
    pb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pb)
    figs = []
    real_close = pb.plt.close
    pb.plt.close = lambda fig=None: figs.append(fig)
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = pb.Bench(os.path.join(bench_dir, name))
        return cache[name]

    tmp = tempfile.mkdtemp(prefix="fb_plotfig_")
    try:
        for plot in pb.PLOTS:
            n0 = len(figs)
            plot(load, tmp)
            if len(figs) != n0 + 1:
                fail(f"{plot.__name__} did not draw exactly one figure")
            fig = figs[-1]
            suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
            for ax in fig.axes:
                where = f"{plot.__name__}, axes '{ax.get_ylabel()}'"
                if not (ax.get_title() or suptitle):
                    fail(where + ": no title")
                if not ax.get_xlabel():
                    fail(where + ": no x label")
                if not re.search(r"\([^)]+\)", ax.get_ylabel()):
                    fail(where + ": the y label names no unit in parentheses")
                leg = ax.get_legend()
                if leg is None or not [t.get_text() for t in leg.get_texts() if t.get_text()]:
                    fail(where + ": no legend")
                if not any(len(l.get_xdata()) >= 2 for l in ax.get_lines()):
                    fail(where + ": no line of two or more points")
        # The data on the decode plot: one line per session file, its points the file's decode_ms
        # rows in context order; the roofline is the last file's decode_roofline_ms.
        decode = figs[0].axes[0]
        lines = {l.get_label(): l for l in decode.get_lines()}
        for label, name in pb.DECODE_FILES:
            want = csv_values(os.path.join(bench_dir, name), "decode_ms")
            got = [l for k, l in lines.items() if k.startswith(label + " (")]
            if len(got) != 1:
                fail(f"decode plot: {len(got)} lines labelled {label}")
            xs, ys = list(got[0].get_xdata()), list(got[0].get_ydata())
            if xs != sorted(want) or ys != [want[c] for c in sorted(want)]:
                fail(f"decode plot, {label}: points {list(zip(xs, ys))} are not {name}'s decode_ms {sorted(want.items())}")
        roof = [l for k, l in lines.items() if k.startswith("roofline")]
        want = csv_values(os.path.join(bench_dir, pb.DECODE_FILES[-1][1]), "decode_roofline_ms")
        if len(roof) != 1 or list(roof[0].get_ydata()) != [want[c] for c in sorted(want)]:
            fail("decode plot: the roofline is not the last file's decode_roofline_ms")
        # Below it, one line per context every session ran: each session's decode_ms at that context.
        by = figs[0].axes[1]
        for c in (4096, 131072):
            got = [l for l in by.get_lines() if l.get_label() == f"context {c // 1024}K"]
            want = [csv_values(os.path.join(bench_dir, name), "decode_ms")[c] for _, name in pb.DECODE_FILES]
            if len(got) != 1 or list(got[0].get_ydata()) != want:
                fail(f"decode by session, {c}: {[list(l.get_ydata()) for l in got]} vs the CSVs' {want}")
        # Verify rows: the first context's line is the file's verify_rows_N_ms, N = 1, 2, ...
        verify = figs[1].axes[0]
        first = verify.get_lines()[0]
        ctx = min(csv_values(os.path.join(bench_dir, pb.VERIFY_FILE), "verify_rows_1_ms"))
        want = [csv_values(os.path.join(bench_dir, pb.VERIFY_FILE), f"verify_rows_{int(n)}_ms")[ctx] for n in first.get_xdata()]
        if list(first.get_ydata()) != want:
            fail(f"verify plot: {list(first.get_ydata())} vs the CSV's {want}")
        # Beside it: each session's verify_rows_N_ms / verify_rows_1_ms per context.
        ratios = {l.get_label(): l for l in figs[1].axes[1].get_lines()}
        for label, name in pb.VERIFY_FILES:
            path = os.path.join(bench_dir, name)
            for c in sorted(csv_values(path, "verify_rows_1_ms")):
                got = [l for k, l in ratios.items() if k.startswith(label + " (") and k.endswith(f", {c // 1024}K")]
                if len(got) != 1:
                    fail(f"verify ratios: {len(got)} lines for {label} at {c}")
                want = [csv_values(path, f"verify_rows_{int(n)}_ms")[c] / csv_values(path, "verify_rows_1_ms")[c]
                        for n in got[0].get_xdata()]
                if list(got[0].get_ydata()) != want:
                    fail(f"verify ratios, {label} at {c}: {list(got[0].get_ydata())} vs the CSV's {want}")
        # DSpark: each session's full-block (and scheduled) line is its CSV's tok/s at each p.
        dspark = {l.get_label(): l for l in figs[2].axes[0].get_lines()}
        for label, full, sched in pb.DSPARK_FILES:
            for name, prefix, kind in ((full, "dspark", "full blocks"), (sched, "dspark_sched", "scheduled")):
                if name is None:
                    continue
                got = [l for k, l in dspark.items() if k.startswith(label + " (") and kind in k]
                if len(got) != 1:
                    fail(f"DSpark plot: {len(got)} {kind} lines for {label}")
                want = [v for p in got[0].get_xdata()
                        for v in csv_values(os.path.join(bench_dir, name), f"{prefix}_p{p:.2f}_tok_s").values()]
                if len(want) < 2 or list(got[0].get_ydata()) != want:
                    fail(f"DSpark plot, {label} {kind}: {list(got[0].get_ydata())} vs {name}'s {want}")
    finally:
        pb.plt.close = real_close
        for f in figs:
            real_close(f)
        shutil.rmtree(tmp, ignore_errors=True)
    return len(figs)


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
        n_figs = check_figures(os.path.join(ROOT, "docs", "bench"))
        # A missing input is an error (the tier sweep's file, whichever it is now).
        tiers_file = re.search(r'^TIERS_FILE = "([^"]+)"', open(os.path.join(ROOT, "tools", "plot_bench.py")).read(), re.M).group(1)
        partial = os.path.join(tmp, "bench")
        shutil.copytree(os.path.join(ROOT, "docs", "bench"), partial)
        os.remove(os.path.join(partial, tiers_file))
        r = run(["--bench", partial, "--out", os.path.join(tmp, "p2")])
        if r.returncode == 0 or tiers_file not in r.stderr:
            fail("a missing CSV did not fail the run: " + r.stderr)
        print(f"PASS: {len(PLOTS)} plots, {n_figs} figures with titles, labels, units, legends and the CSVs' values")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
