#!/usr/bin/env python3
"""GET /metrics (Prometheus text format 0.0.4) against `flashbox serve` on the built-in tiny model
(issue 24), with the expert tiers (--expert-slots) and the KV ledger (--kv-budget-bytes) on.

Scrapes before and after requests through the openai and anthropic SDKs and checks: the text
parses line by line (HELP and TYPE once per family, before its samples; label syntax; values);
counters never go down; requests, prompt and generated tokens moved by exactly what the SDKs'
usage reports; steps, step time and time-to-first-token counts moved; the routed experts' lookups
and bytes by tier (hbm / host / drive) and the op times by family are there and equal what
/v1/stats reports at the same (idle) moment; the ledger shows the KV budget; queue and active
gauges are back at 0; the inter-token gap histogram and the draft calls (issue 20) equal /v1/stats.
"""
import json, os, re, sys, time, urllib.request

from serve_util import Server, tiny_model, bin_and_model, Checks  # noqa: E402 (tests/server/, beside this file)

try:
    import openai, anthropic  # noqa: F401
except ImportError as e:
    print(f"FAIL: python packages missing ({e}); tools/test.sh installs them into build/pyenv")
    sys.exit(1)

check = Checks()
BUDGET = 4000000000


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text):
    """{(name, frozenset(labels)): float}, {family: type}; format errors into `errors`."""
    samples, types, helps, errors, current = {}, {}, set(), [], None
    for no, line in enumerate(text.split("\n"), 1):
        if not line:
            if no != len(text.split("\n")):
                errors.append(f"line {no}: empty")
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            fam = parts[2]
            if line[2] == "H":
                if fam in helps:
                    errors.append(f"line {no}: second HELP of {fam}")
                helps.add(fam)
            else:
                if fam in types or fam not in helps or len(parts) != 4 or parts[3] not in ("counter", "gauge", "summary", "histogram"):
                    errors.append(f"line {no}: bad TYPE: {line}")
                types[fam] = parts[3] if len(parts) == 4 else "?"
                current = fam
            continue
        m = SAMPLE.match(line)
        if not m:
            errors.append(f"line {no}: not a sample: {line}")
            continue
        name, labels = m.group(1), {}
        if m.group(3):
            rest = m.group(3)
            while rest:
                lm = LABEL.match(rest)
                if not lm:
                    errors.append(f"line {no}: bad labels: {line}")
                    break
                labels[lm.group(1)] = re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2))
                rest = rest[lm.end():]
        try:
            value = float(m.group(4))
        except ValueError:
            errors.append(f"line {no}: bad value: {line}")
            continue
        own = (name == current or (types.get(current) in ("summary", "histogram") and name in (current + "_sum", current + "_count"))
               or (types.get(current) == "histogram" and name == current + "_bucket" and "le" in labels))
        if not own:
            errors.append(f"line {no}: {name} outside its family {current}")
        key = (name, frozenset(labels.items()))
        if key in samples:
            errors.append(f"line {no}: repeated sample {line}")
        samples[key] = value
    return samples, types, errors


def scrape(srv):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=10) as r:  # no key needed (docs/serving.md)
        ctype = r.headers.get("Content-Type", "")
        text = r.read().decode()
    return text, ctype


def v(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def stats(srv):
    req = urllib.request.Request(srv.base + "/v1/stats", headers={"Authorization": "Bearer k"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def main():
    binary, model = bin_and_model()
    srv = Server(binary, ["--model", model, "--expert-slots", "2", "--kv-budget-bytes", str(BUDGET)])
    try:
        text0, ctype = scrape(srv)
        check(ctype.startswith("text/plain") and "version=0.0.4" in ctype, f"content type {ctype!r}")
        s0, types0, err0 = parse(text0)
        check(not err0, "the idle scrape parses: " + "; ".join(err0[:5]))
        check(any(k[0] == "flashbox_info" and ("backend", "cpu") in k[1] and x == 1 for k, x in s0.items()), "flashbox_info names the backend")
        # Requests through the SDKs: usage is what the counters must move by.
        oa, an = srv.oa(300), srv.an(300)
        prompt = gen = 0
        for i in range(2):
            r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Count {i}"}], max_tokens=6, seed=i,
                                           extra_body={"thinking": {"type": "disabled"}})
            prompt += r.usage.prompt_tokens
            gen += r.usage.completion_tokens
        r = oa.completions.create(model="m", prompt="The sky is", max_tokens=5, temperature=0)
        prompt += r.usage.prompt_tokens
        gen += r.usage.completion_tokens
        m = an.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}], thinking={"type": "disabled"})
        # This server's Anthropic input_tokens is the whole prompt; cache_read_input_tokens is the
        # part of it reused (Anthropic's own API counts the two apart).
        prompt += m.usage.input_tokens
        gen += m.usage.output_tokens
        # Idle again (every request has finished its bookkeeping), then one instant read both ways.
        for _ in range(100):
            s1, _, _ = parse(scrape(srv)[0])
            if v(s1, "flashbox_requests_active") == 0 and v(s1, "flashbox_requests_total") == v(s0, "flashbox_requests_total") + 4:
                break
            time.sleep(0.1)
        text1, _ = scrape(srv)
        js = stats(srv)
        s1, types1, err1 = parse(text1)
        check(not err1, "the busy scrape parses: " + "; ".join(err1[:5]))
        down = [k for k, x in s0.items() if types0.get(k[0]) == "counter" and s1.get(k, 0) < x]
        check(not down, f"counters never go down ({down[:3]})")
        d = lambda name: v(s1, name) - v(s0, name)  # noqa: E731
        check(d("flashbox_requests_total") == 4, f"requests_total +4 ({d('flashbox_requests_total')})")
        check(d("flashbox_prompt_tokens_total") == prompt, f"prompt tokens +{prompt} as the SDKs' usage says ({d('flashbox_prompt_tokens_total')})")
        check(d("flashbox_generated_tokens_total") == gen and d("flashbox_emitted_tokens_total") == gen,
              f"generated and emitted tokens +{gen} ({d('flashbox_generated_tokens_total')}, {d('flashbox_emitted_tokens_total')})")
        check(d("flashbox_time_to_first_token_seconds_count") == 4 and d("flashbox_time_to_first_token_seconds_sum") > 0, "TTFT summary +4")
        check(d("flashbox_steps_total") >= 4 and d("flashbox_step_seconds_total") > 0 and d("flashbox_step_rows_total") >= d("flashbox_steps_total"),
              f"steps +{d('flashbox_steps_total')}, {d('flashbox_step_seconds_total'):.3f} s")
        check(v(s1, "flashbox_queue_depth") == 0 and v(s1, "flashbox_requests_active") == 0, "queue and active back at 0")
        check(v(s1, "flashbox_max_sessions") == js["requests"]["max_sessions"], "max_sessions as /v1/stats")
        # Issue 20: the inter-token gap histogram (cumulative, +Inf = count) and the draft calls, as /v1/stats.
        lat = js["latency"]
        check(types1.get("flashbox_inter_token_seconds") == "histogram" and d("flashbox_inter_token_seconds_count") > 0 and
              v(s1, "flashbox_inter_token_seconds_count") == lat["gap_count"] and
              v(s1, "flashbox_inter_token_seconds_bucket", le="+Inf") == lat["gap_count"] and
              all(v(s1, "flashbox_inter_token_seconds_bucket", le=("+Inf" if b["le"] == "+Inf" else format(b["le"], "g")))
                  == b["count"] for b in lat["gap_buckets"]),
              f"inter-token gaps: {v(s1, 'flashbox_inter_token_seconds_count')} as /v1/stats {lat['gap_count']}")
        check(v(s1, "flashbox_draft_calls_total") == js["steps"]["draft_calls"] and
              v(s1, "flashbox_draft_blocks_total") == js["steps"]["draft_blocks"], "draft calls and blocks as /v1/stats")
        # Expert traffic by tier (Executor::stats): present, moving, equal to /v1/stats.
        x = js["expert_traffic"]
        check(x is not None and types1.get("flashbox_expert_lookups_total") == "counter", "expert traffic families present")
        for tier in ("hbm", "host", "drive"):
            check(v(s1, "flashbox_expert_lookups_total", tier=tier) == x[tier]["lookups"] and
                  v(s1, "flashbox_expert_bytes_total", tier=tier) == x[tier]["bytes"],
                  f"expert {tier}: lookups {v(s1, 'flashbox_expert_lookups_total', tier=tier)} bytes "
                  f"{v(s1, 'flashbox_expert_bytes_total', tier=tier)} as /v1/stats {x[tier]}")
        check(sum(v(s1, "flashbox_expert_lookups_total", tier=t) for t in ("hbm", "host", "drive")) >
              sum(v(s0, "flashbox_expert_lookups_total", tier=t) or 0 for t in ("hbm", "host", "drive")), "expert lookups moved")
        check(v(s1, "flashbox_expert_slot_hits_total") == js["expert_tiers"]["slot_hits"] and
              v(s1, "flashbox_expert_drive_reads_total") == js["expert_tiers"]["drive_reads"], "expert tiers' raw counters as /v1/stats")
        # Op times by family (CPU executor).
        ops = js["op_time"]
        check(ops is not None and v(s1, "flashbox_op_steps_total") == ops["steps"], "op steps as /v1/stats")
        for fam, sec in ops["seconds"].items():
            got = v(s1, "flashbox_op_seconds_total", family=fam)
            check(got is not None and abs(got - sec) <= 1e-12 * max(1.0, sec), f"op {fam}: {got} s as /v1/stats {sec}")
        check(d("flashbox_op_steps_total") > 0, "op steps moved")
        # Engram rows by fetch (hidden, exposed, in place), bytes and the exposed wait, as /v1/stats.
        eg = js["engram"]
        check(eg is not None and types1.get("flashbox_engram_rows_total") == "counter", "Engram families present")
        for fetch in ("hidden", "exposed", "in_place"):
            check(v(s1, "flashbox_engram_rows_total", fetch=fetch) == eg[fetch],
                  f"Engram {fetch} rows {v(s1, 'flashbox_engram_rows_total', fetch=fetch)} as /v1/stats {eg[fetch]}")
        check(v(s1, "flashbox_engram_bytes_total") == eg["bytes"] and
              abs(v(s1, "flashbox_engram_exposed_seconds_total") - eg["exposed_s"]) <= 1e-12 * max(1.0, eg["exposed_s"]),
              "Engram bytes and exposed seconds as /v1/stats")
        check(sum(v(s1, "flashbox_engram_rows_total", fetch=f) - (v(s0, "flashbox_engram_rows_total", fetch=f) or 0)
                  for f in ("hidden", "exposed", "in_place")) > 0, "Engram rows moved")
        # The KV ledger of --kv-budget-bytes.
        tier = next((t for t, u in js["ledger"].items() if u), None)
        check(tier is not None and v(s1, "flashbox_ledger_bytes", tier=tier, kind="target") == BUDGET,
              f"ledger {tier} target {v(s1, 'flashbox_ledger_bytes', tier=tier, kind='target')}")
        check(v(s1, "flashbox_kv_budget_bytes") == BUDGET, "kv budget gauge")
    finally:
        srv.close()
    check.finish()


if __name__ == "__main__":
    main()
