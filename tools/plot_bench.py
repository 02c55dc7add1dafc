#!/usr/bin/env python3
"""Plots of the committed benchmark CSVs (docs/bench/*.csv) as PNGs (docs/plots/ by default).

    build/pyenv/bin/python3 tools/plot_bench.py [--bench docs/bench] [--out docs/plots]

CSV rows: commit, gpu, driver, runtime, sm_clock_mhz, mem_clock_mhz, row (the metric), context,
value, unit, limit_share. Each plot names the files it reads (the current result files of
docs/results.md); a file or metric that is missing is an error, not an empty plot.
  decode_ms_vs_context.png   decode ms/token vs context, one line per session's final run, with the
                             HBM copy roofline (decode_roofline_ms)
  verify_cost_vs_rows.png    DSpark verify step ms vs rows per step, per context, against n x one row
  dspark_tok_s_vs_accept.png DSpark tok/s vs forced acceptance p: full blocks and the scheduled
                             (back-off) run, plain decoding as a line
  tiers_vs_skew.png          tier sweep: HBM hit rate (measured LFU and the best static placement)
                             and ms/token (measured, plan, floor, ceiling) vs the top-10 share
  prefill_tok_s_vs_context.png  tok/s of one 2,048-row prefill chunk ending at each context
matplotlib comes from PyPI into build/pyenv (tools/test.sh); it is a tool, not a product dependency.
"""
import argparse, csv, os, re, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Session -> the file holding its final decode numbers (docs/results.md and docs/history.md, "Decode").
DECODE_FILES = [("session 3", "h200-synthetic-final-s3-20261129.csv"),
                ("session 4", "h200-synthetic-s4-fbc2be4.csv"),
                ("session 5", "h200-synthetic-s5-2048c9b.csv"),
                ("session 6", "h200-synthetic-s6-final-1611053.csv"),
                ("session 7", "h200-dspark-s7-6d85e0b.csv"),
                ("session 8", "h200-synthetic-s8-final-2c458d3.csv"),
                ("session 9", "h200-synthetic-s9-354c406.csv"),
                ("session 10", "h200-synthetic-s10-f6a0e60.csv"),
                ("session 11", "h200-synthetic-s11-c7cd4b1.csv"),
                ("session 12", "h200-synthetic-s12-c3ca05a.csv"),
                ("session 13", "h200-synthetic-s13-c7e0d28.csv"),
                ("session 14", "h200-synthetic-s14-5759d47.csv")]
# The files docs/results.md names as the current figures of each kind.
VERIFY_FILE = "h200-synthetic-s14-5759d47.csv"
DSPARK_FILE = "h200-synthetic-s11-b9542c3-dspark.csv"
TIERS_FILE = "h200-tiers-fast-s14-5759d47.csv"
PREFILL_FILES = [("session 3", "h200-synthetic-final-s3-20261129.csv"),
                 ("session 4", "h200-synthetic-s4-fbc2be4.csv")]


class Bench:
    """One CSV: value(metric, context) and the rows' identity (commit, GPU)."""

    def __init__(self, path):
        self.path = path
        self.rows = {}
        self.units = {}
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["row"], int(r["context"]))
                self.rows[key] = float(r["value"])
                self.units[r["row"]] = r["unit"]
                self.commit, self.gpu = r["commit"], r["gpu"]

    def value(self, metric, context):
        if (metric, context) not in self.rows:
            raise KeyError(f"{os.path.basename(self.path)}: no row {metric} at context {context}")
        return self.rows[(metric, context)]

    def contexts(self, metric):
        return sorted(c for (m, c) in self.rows if m == metric)

    def metrics(self, pattern):
        return sorted({m for (m, _) in self.rows if re.fullmatch(pattern, m)})


def ctx_label(c):
    return f"{c // 1024}K" if c >= 1024 and c % 1024 == 0 else str(c)


def source_note(ax, benches):
    names = ", ".join(f"{os.path.basename(b.path)} ({b.commit})" for b in benches)
    ax.figure.text(0.01, 0.005, "data: " + names, fontsize=6, color="0.4", ha="left", va="bottom", wrap=True)


def log2_context_axis(ax, contexts):
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts)
    ax.set_xticklabels([ctx_label(c) for c in contexts])
    ax.set_xlabel("context (tokens)")


def plot_decode(load, out):
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    used, all_ctx = [], set()
    colors = plt.get_cmap("tab20").colors  # one colour per session (the default cycle repeats after 10)
    for i, (label, name) in enumerate(DECODE_FILES):
        b = load(name)
        cs = b.contexts("decode_ms")
        if not cs:
            raise KeyError(f"{name}: no decode_ms rows")
        ax.plot(cs, [b.value("decode_ms", c) for c in cs], marker="o", color=colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20],
                label=f"{label} ({b.commit})")
        all_ctx.update(cs)
        used.append(b)
    last = used[-1]
    cs = last.contexts("decode_roofline_ms")
    ax.plot(cs, [last.value("decode_roofline_ms", c) for c in cs], "k--", label="roofline: bytes/token at the measured HBM copy rate")
    log2_context_axis(ax, sorted(all_ctx))
    ax.set_ylabel("decode (ms/token)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Decode, batch 1, synthetic model at the released dimensions ({last.gpu})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: nine sessions
    source_note(ax, used)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "decode_ms_vs_context.png"), dpi=120)
    plt.close(fig)


def plot_verify(load, out):
    b = load(VERIFY_FILE)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    rows = sorted(int(re.match(r"verify_rows_(\d+)_ms", m).group(1)) for m in b.metrics(r"verify_rows_\d+_ms"))
    if not rows:
        raise KeyError(f"{VERIFY_FILE}: no verify_rows_N_ms rows")
    for c in b.contexts("verify_rows_1_ms"):
        ms = [b.value(f"verify_rows_{n}_ms", c) for n in rows]
        line, = ax.plot(rows, ms, marker="o", label=f"context {ctx_label(c)}")
        ax.plot(rows, [ms[0] * n for n in rows], ":", color=line.get_color(), alpha=0.6)
    ax.plot([], [], "k:", label="n x one row (no sharing)")
    ax.set_xlabel("rows per step (anchor + drafts)")
    ax.set_ylabel("verify step (ms)")
    ax.set_xticks(rows)
    ax.set_ylim(bottom=0)
    ax.set_title(f"DSpark verify cost vs rows ({b.gpu}, {b.commit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    source_note(ax, [b])
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "verify_cost_vs_rows.png"), dpi=120)
    plt.close(fig)


def plot_dspark(load, out):
    b = load(DSPARK_FILE)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    plain = []
    for prefix, label, style in (("dspark", "full blocks", "o-"), ("dspark_sched", "scheduled (confidence + back-off)", "s-")):
        ms = b.metrics(prefix + r"_p[\d.]+_tok_s")
        if not ms:
            raise KeyError(f"{DSPARK_FILE}: no {prefix}_pX_tok_s rows")
        ps = sorted(float(re.match(prefix + r"_p([\d.]+)_tok_s", m).group(1)) for m in ms)
        ctx = b.contexts(ms[0])[0]
        ax.plot(ps, [b.value(f"{prefix}_p{p:.2f}_tok_s", ctx) for p in ps], style, label=label)
        plain += [b.value(f"{prefix}_p{p:.2f}_plain_tok_s", ctx) for p in ps]
    ax.axhline(sum(plain) / len(plain), color="k", ls="--", label=f"plain decoding ({sum(plain) / len(plain):.1f} tok/s)")
    ax.set_xlabel("forced acceptance probability p per drafted token")
    ax.set_ylabel("decode (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"DSpark end to end, context {ctx_label(ctx)} ({b.gpu}, {b.commit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    source_note(ax, [b])
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "dspark_tok_s_vs_accept.png"), dpi=120)
    plt.close(fig)


def plot_tiers(load, out):
    b = load(TIERS_FILE)
    ms = b.metrics(r"tier_top10_[\d]+_decode_ms")
    if not ms:
        raise KeyError(f"{TIERS_FILE}: no tier_top10_N_decode_ms rows")
    skews = sorted(int(re.match(r"tier_top10_(\d+)_decode_ms", m).group(1)) for m in ms)
    ctx = b.contexts(ms[0])[0]
    xs = [s / 100 for s in skews]
    v = lambda kind: [b.value(f"tier_top10_{s}_{kind}", ctx) for s in skews]  # noqa: E731
    slots = int(b.value("tier_slots_per_layer", ctx))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.4))
    a1.plot(xs, [100 * x for x in v("hbm_hit")], "o-", label="measured (LFU slots)")
    a1.plot(xs, [100 * x for x in v("static_hit")], "s--", label="best static placement")
    a1.set_ylabel("HBM slot hit rate (%)")
    a1.set_ylim(0, 100)
    a2.plot(xs, v("decode_ms"), "o-", label="measured")
    a2.plot(xs, v("plan_ms"), "s--", label="plan (static misses at the pinned peak)")
    a2.fill_between(xs, v("ceiling_ms"), v("floor_ms"), alpha=0.15, label="model: copies overlapped .. not overlapped")
    a2.axhline(b.value("tier_allhit_decode_ms", ctx), color="k", ls=":", label="all experts hit")
    a2.set_ylabel("decode (ms/token)")
    a2.set_ylim(bottom=0)
    for ax in (a1, a2):
        ax.set_xlabel("routing skew: share of picks on the top-10% experts")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Expert tiers: {slots} HBM slots per layer of 384 experts, context {ctx_label(ctx)} ({b.gpu}, {b.commit})")
    source_note(a1, [b])
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "tiers_vs_skew.png"), dpi=120)
    plt.close(fig)


def plot_prefill(load, out):
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    used, all_ctx = [], set()
    for label, name in PREFILL_FILES:
        b = load(name)
        cs = b.contexts("prefill_frontier_tok_s")
        if not cs:
            raise KeyError(f"{name}: no prefill_frontier_tok_s rows")
        ax.plot(cs, [b.value("prefill_frontier_tok_s", c) for c in cs], marker="o", label=f"{label} ({b.commit})")
        all_ctx.update(cs)
        used.append(b)
    log2_context_axis(ax, sorted(all_ctx))
    ax.set_ylabel("prefill (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Prefill: one 2,048-row chunk ending at the context ({used[-1].gpu})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    source_note(ax, used)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "prefill_tok_s_vs_context.png"), dpi=120)
    plt.close(fig)


PLOTS = [plot_decode, plot_verify, plot_dspark, plot_tiers, plot_prefill]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(here, "..", "docs", "bench"), help="folder of the CSVs")
    ap.add_argument("--out", default=os.path.join(here, "..", "docs", "plots"), help="folder for the PNGs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = Bench(os.path.join(a.bench, name))
        return cache[name]

    plt.rcParams.update({"font.size": 9, "savefig.facecolor": "white"})
    try:
        for p in PLOTS:
            p(load, a.out)
    except (OSError, KeyError, ValueError) as e:
        print(f"plot_bench: {e}", file=sys.stderr)
        return 1
    print(f"plot_bench: wrote {len(PLOTS)} plots to {os.path.normpath(a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
