#!/usr/bin/env python3
"""Plots of the committed benchmark CSVs (docs/bench/*.csv) as PNGs (docs/plots/ by default).

    build/pyenv/bin/python3 tools/plot_bench.py [--bench docs/bench] [--out docs/plots]

CSV rows: commit, gpu, driver, runtime, sm_clock_mhz, mem_clock_mhz, row (the metric), context,
value, unit, limit_share. Each plot names the files it reads (the current result files of
docs/results.md); a file or metric that is missing is an error, not an empty plot.
  decode_ms_vs_context.png   decode ms/token vs context, one line per session's final run (the newest
                             drawn thick with its values), with the newest file's roofline
                             (decode_roofline_ms); below, 4K and 128K decode by session
  verify_cost_vs_rows.png    DSpark verify step ms vs rows per step, per context, against n x one row
                             (the newest session); beside it the step as a multiple of one row for
                             the last sessions
  dspark_tok_s_vs_accept.png DSpark tok/s vs forced acceptance p, one line per session: full blocks and,
                             where a session ran it, the scheduled (back-off) run, plain decoding as
                             lines; beside it the same runs as a multiple of plain with the issue's goals
  tiers_vs_skew.png          tier sweep: HBM hit rate (measured LFU and the best static placement)
                             and ms/token (measured, plan, floor, ceiling) vs the top-10 share
  prefill_tok_s_vs_context.png  tok/s of one 2,048-row prefill chunk ending at each context
matplotlib comes from PyPI into build/pyenv (tools/test.sh); it is a tool, not a product dependency.
"""
import argparse, csv, os, re, sys, textwrap

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
                ("session 14", "h200-synthetic-s14-5759d47.csv"),
                ("session 16", "h200-synthetic-s16-bb0368f.csv"),
                ("session 17", "h200-synthetic-s17-743fa0d.csv"),
                ("session 18", "h200-synthetic-s18-8ebbcfb.csv"),
                ("session 19", "h200-synthetic-s19-af9cce4.csv")]
# The files docs/results.md names as the current figures of each kind.
VERIFY_FILE = "h200-synthetic-s19-af9cce4.csv"
# Sessions whose verify rows are compared as multiples of one row (the last is VERIFY_FILE).
VERIFY_FILES = [("session 14", "h200-synthetic-s14-5759d47.csv"),
                ("session 16", "h200-synthetic-s16-bb0368f.csv"),
                ("session 17", "h200-synthetic-s17-743fa0d.csv"),
                ("session 18", "h200-synthetic-s18-8ebbcfb.csv"),
                ("session 19", VERIFY_FILE)]
# Session -> (its full-block DSpark sweep, its scheduled sweep or None); the last is the current one.
DSPARK_FILES = [("session 11", "h200-synthetic-s11-b9542c3-dspark.csv", "h200-synthetic-s11-b9542c3-dspark.csv"),
                ("session 14", "h200-synthetic-s14-5759d47.csv", "h200-dspark-sweep-s14-5759d47.csv"),
                ("session 16", "h200-synthetic-s16-bb0368f.csv", None),
                ("session 17", "h200-synthetic-s17-743fa0d.csv", None),
                ("session 18", "h200-synthetic-s18-8ebbcfb.csv", None),
                ("session 19", "h200-dspark-s19-95cc4a8-600-tokens.csv", None)]
# The DSpark goals, (p, x plain): scheduled at p = 0 no slower than 0.95x, p = 0.8 at 2x.
DSPARK_GOALS = [(0.0, 0.95), (0.8, 2.0)]
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
    """The files and commits under the figure, wrapped to its width; returns the figure fraction it
    takes at the bottom (the rect for tight_layout, so the x label stays clear of it)."""
    fig = ax.figure
    names, seen = [], set()
    for b in benches:
        if b.path not in seen:
            seen.add(b.path)
            names.append(f"{os.path.basename(b.path)} ({b.commit})")
    width = int(fig.get_figwidth() * 72 / 3.1)  # characters of 6 pt text across the figure
    lines = textwrap.wrap("data: " + ", ".join(names), width)
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=6, color="0.4", ha="left", va="bottom")
    return (len(lines) * 6 * 1.3 + 6) / (fig.get_figheight() * 72)


def log2_context_axis(ax, contexts):
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts)
    ax.set_xticklabels([ctx_label(c) for c in contexts])
    ax.set_xlabel("context (tokens)")


def session_colors(n):
    """One colour per session, old to new along viridis; the newest stands apart in red."""
    cmap = plt.get_cmap("viridis")
    return [cmap(0.8 * i / max(n - 2, 1)) for i in range(n - 1)] + ["tab:red"]


def plot_decode(load, out):
    fig, (ax, by) = plt.subplots(2, 1, figsize=(10.5, 8.2), gridspec_kw={"height_ratios": [3, 2]})
    used, all_ctx = [], set()
    colors = session_colors(len(DECODE_FILES))
    for i, (label, name) in enumerate(DECODE_FILES):
        b = load(name)
        cs = b.contexts("decode_ms")
        if not cs:
            raise KeyError(f"{name}: no decode_ms rows")
        newest = i == len(DECODE_FILES) - 1
        ms = [b.value("decode_ms", c) for c in cs]
        ax.plot(cs, ms, marker="o", color=colors[i], lw=2.2 if newest else 1.2, ms=6 if newest else 4,
                zorder=3 if newest else 2, label=f"{label} ({b.commit})")
        if newest:
            for c, v in zip(cs, ms):
                ax.annotate(f"{v:.2f}", (c, v), textcoords="offset points", xytext=(0, -13), ha="center",
                            fontsize=8, color=colors[i])
        all_ctx.update(cs)
        used.append(b)
    last = used[-1]
    cs = last.contexts("decode_roofline_ms")
    roof = [last.value("decode_roofline_ms", c) for c in cs]
    ax.plot(cs, roof, "k--", label=f"roofline: {last.commit}'s decode_roofline_ms\n(bytes/token at the HBM copy "
            f"rate of\nthe same run, {last.value('hbm_d2d_copy', 0):,.0f} GB/s)")
    for c, v in zip(cs, roof):
        ax.annotate(f"{v:.2f}", (c, v), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=8)
    log2_context_axis(ax, sorted(all_ctx))
    ax.set_ylabel("decode (ms/token)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Decode, batch 1, synthetic model at the released dimensions ({last.gpu})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: fourteen sessions
    # Below: the two contexts every session ran, by session, so the progression reads left to right.
    nums = [int(label.split()[-1]) for label, _ in DECODE_FILES]
    for c, style, dy in ((4096, "o-", -11), (131072, "s--", 9)):
        ms = [b.value("decode_ms", c) for b in used]
        line, = by.plot(nums, ms, style, label=f"context {ctx_label(c)}")
        by.annotate(f"{ms[-1]:.2f}", (nums[-1], ms[-1]), textcoords="offset points", xytext=(4, dy), va="center",
                    fontsize=8, color=line.get_color())
    by.set_xticks(nums)
    by.set_xlim(nums[0] - 0.5, nums[-1] + 1.0)
    by.set_xlabel("session (its final run's commit: the legend above)")
    by.set_ylabel("decode (ms/token)")
    by.set_ylim(bottom=0)
    by.set_title("Decode at 4K and 128K context by session")
    by.grid(alpha=0.3)
    by.legend(fontsize=8, loc="lower left")
    bottom = source_note(ax, used)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(os.path.join(out, "decode_ms_vs_context.png"), dpi=120)
    plt.close(fig)


def verify_rows(b):
    rows = sorted(int(re.match(r"verify_rows_(\d+)_ms", m).group(1)) for m in b.metrics(r"verify_rows_\d+_ms"))
    if not rows:
        raise KeyError(f"{os.path.basename(b.path)}: no verify_rows_N_ms rows")
    return rows


def plot_verify(load, out):
    b = load(VERIFY_FILE)
    fig, (ax, rx) = plt.subplots(1, 2, figsize=(11, 4.6))
    rows = verify_rows(b)
    for c in b.contexts("verify_rows_1_ms"):
        ms = [b.value(f"verify_rows_{n}_ms", c) for n in rows]
        line, = ax.plot(rows, ms, marker="o", label=f"context {ctx_label(c)}")
        ax.plot(rows, [ms[0] * n for n in rows], ":", color=line.get_color(), alpha=0.6)
        ax.annotate(f"{ms[-1]:.2f}", (rows[-1], ms[-1]), textcoords="offset points", xytext=(6, 0), va="center",
                    fontsize=8, color=line.get_color())
    ax.plot([], [], "k:", label="n x one row (no sharing)")
    ax.set_xlabel("rows per step (anchor + drafts)")
    ax.set_ylabel("verify step (ms)")
    ax.set_xticks(rows)
    ax.set_xlim(rows[0] - 0.3, rows[-1] + 0.8)
    ax.set_ylim(bottom=0)
    ax.set_title(f"DSpark verify cost vs rows ({b.gpu}, {b.commit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    # Beside it: the step as a multiple of one row, per session and context.
    used = []
    colors = session_colors(len(VERIFY_FILES))
    for i, (label, name) in enumerate(VERIFY_FILES):
        v = load(name)
        vr = verify_rows(v)
        for c, style in zip(v.contexts("verify_rows_1_ms"), ("o-", "s--")):
            ratio = [v.value(f"verify_rows_{n}_ms", c) / v.value("verify_rows_1_ms", c) for n in vr]
            rx.plot(vr, ratio, style, color=colors[i], label=f"{label} ({v.commit}), {ctx_label(c)}")
            if i == len(VERIFY_FILES) - 1:
                rx.annotate(f"{ratio[-1]:.2f}x", (vr[-1], ratio[-1]), textcoords="offset points", xytext=(6, 0),
                            va="center", fontsize=8, color=colors[i])
        used.append(v)
    rx.set_xlabel("rows per step (anchor + drafts)")
    rx.set_ylabel("verify step / one-row step (x one row)")
    rx.set_xticks(rows)
    rx.set_xlim(rows[0] - 0.3, rows[-1] + 0.8)
    rx.set_ylim(bottom=1)
    rx.set_title("Verify step as a multiple of one row, by session")
    rx.grid(alpha=0.3)
    rx.legend(fontsize=7)
    bottom = source_note(ax, used)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(os.path.join(out, "verify_cost_vs_rows.png"), dpi=120)
    plt.close(fig)


def dspark_sweep(b, prefix):
    """(p values, tok/s, plain tok/s of the same runs) of one sweep: dspark or dspark_sched."""
    ms = b.metrics(prefix + r"_p[\d.]+_tok_s")
    if not ms:
        raise KeyError(f"{os.path.basename(b.path)}: no {prefix}_pX_tok_s rows")
    ps = sorted(float(re.match(prefix + r"_p([\d.]+)_tok_s", m).group(1)) for m in ms)
    ctx = b.contexts(ms[0])[0]
    tok = [b.value(f"{prefix}_p{p:.2f}_tok_s", ctx) for p in ps]
    plain = [b.value(f"{prefix}_p{p:.2f}_plain_tok_s", ctx) for p in ps]
    return ps, tok, plain, ctx


def plot_dspark(load, out):
    fig, (ax, sx) = plt.subplots(1, 2, figsize=(12, 5.0))
    used, ctxs = [], set()
    colors = session_colors(len(DSPARK_FILES))
    for i, (label, full_name, sched_name) in enumerate(DSPARK_FILES):
        b = load(full_name)
        runs = [(b, "dspark", "full blocks", "o-")]
        if sched_name:
            runs.append((load(sched_name), "dspark_sched", "scheduled (confidence + back-off)", "s--"))
        plain = []
        for r, prefix, kind, style in runs:
            ps, tok, pl, ctx = dspark_sweep(r, prefix)
            ax.plot(ps, tok, style, color=colors[i], label=f"{label} ({r.commit}): {kind}")
            sx.plot(ps, [t / q for t, q in zip(tok, pl)], style, color=colors[i], label=f"{label} ({r.commit}): {kind}")
            plain += pl
            ctxs.add(ctx)
            used.append(r)
        mean = sum(plain) / len(plain)
        ax.axhline(mean, color=colors[i], ls=":", lw=1.2, label=f"{label}: plain decoding ({mean:.1f} tok/s)")
    last_ps, last_tok, last_plain, _ = dspark_sweep(load(DSPARK_FILES[-1][1]), "dspark")
    for p, t, q in zip(last_ps, last_tok, last_plain):
        ax.annotate(f"{t:.1f}", (p, t), textcoords="offset points", xytext=(6, -9), ha="left", fontsize=8,
                    color=colors[-1])
        sx.annotate(f"{t / q:.2f}x", (p, t / q), textcoords="offset points", xytext=(6, -9), ha="left", fontsize=8,
                    color=colors[-1])
    sx.axhline(1.0, color="k", ls=":", lw=1, label="plain decoding (1x)")
    sx.plot([p for p, _ in DSPARK_GOALS], [g for _, g in DSPARK_GOALS], "k*", ms=11, ls="none",
            label="the issue's goals (0.95x at p = 0, 2x at p = 0.8)")
    ctx = ", ".join(ctx_label(c) for c in sorted(ctxs))
    ax.set_ylabel("decode (tokens/s)")
    ax.set_title(f"DSpark end to end, context {ctx} ({b.gpu})")
    sx.set_ylabel("DSpark / plain decoding (x plain)")
    sx.set_title("DSpark as a multiple of plain decoding in the same run")
    for a in (ax, sx):
        a.set_xlabel("forced acceptance probability p per drafted token")
        a.set_xlim(-0.05, 1.12)  # room for the newest session's values right of its points
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="upper left")
    bottom = source_note(ax, used)
    fig.tight_layout(rect=(0, bottom, 1, 1))
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
    bottom = source_note(a1, [b])
    fig.tight_layout(rect=(0, bottom, 1, 1))
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
    bottom = source_note(ax, used)
    fig.tight_layout(rect=(0, bottom, 1, 1))
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
