#!/usr/bin/env python3
"""The live dashboard (issue 24) against `flashbox serve` on the built-in tiny model (CPU).

JSON part: GET / serves the embedded page without a key; /v1/stats needs the key (401 without);
after requests the counters move (requests, tokens emitted and generated, steps), the disk KV
cache, the expert tiers (--expert-slots) and the KV ledger (--kv-budget-bytes) report numbers, the
executor's memory by tier reports host weights (checked against the shards), sessions, scratch and
expert buffers and the drives' reads, and the HBM ledger is null ("n/a" on the CPU). Browser part: headless Chromium (Debian `chromium`)
renders the page while a request streams, polls at least twice, and the DOM holds the live
numbers (the HBM memory card all "n/a"); then the same page against a stand-in /v1/stats that
reports an HBM tier as the CUDA executor does (and no host tier) must show each HBM part and "n/a"
for the host's; the screenshots are kept in --artifacts. Exits 77 (ctest: skipped) after the JSON
part passes when chromium is not installed.
"""
import argparse, http.server, json, os, re, shutil, socket, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request

from serve_util import Server, free_port, tiny_model  # noqa: E402 (tests/server/, beside this file)

KEY = "dash-key"


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)




def get(base, path, key=None):
    req = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def stats(base):
    st, _, body = get(base, "/v1/stats", KEY)
    check(st == 200, f"/v1/stats with the key: HTTP {st}")
    return json.loads(body)


def chat(base, max_tokens, stream=False, text="Hello there, how are you?"):
    body = json.dumps({"max_tokens": max_tokens, "temperature": 0, "stream": stream,
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def chromium(url, user_dir, *args):
    cmd = [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--user-data-dir=" + user_dir, "--window-size=1400,1400", "--virtual-time-budget=4000", *args, url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def js_bytes(v):
    """The page's bytes() formatting (dashboard.js)."""
    units, i = ["B", "KB", "MB", "GB", "TB"], 0
    while v >= 1000 and i < len(units) - 1:
        v /= 1000
        i += 1
    return (f"{v:.1f}" if i else f"{v:.0f}") + " " + units[i]


class CannedStats:
    """The page's files as `base` serves them, and GET /v1/stats answered with `stats` (a dict):
    what the page shows for counters this server's executor does not report."""

    def __init__(self, base, stats):
        files = {}
        for path in ("/", "/dashboard/dashboard.js", "/dashboard/dashboard.css", "/dashboard/chart.js"):
            st, ctype, body = get(base, path)
            check(st == 200, f"GET {path} -> {st}")
            files[path] = (ctype, body)
        files["/v1/stats"] = ("application/json", json.dumps(stats).encode())

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ctype, body = files.get(self.path, ("text/plain", b"not found"))
                self.send_response(200 if self.path in files else 404)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def dom_text(dom, el_id):
    m = re.search(r'id="' + el_id + r'"[^>]*>([^<]*)<', dom)
    check(m is not None, f"the rendered page has no element #{el_id}")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--artifacts", default="", help="folder for the screenshot (default: a temporary one)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fb_dashboard_")
    model = a.model
    if not model:
        model = os.path.join(tmp, "tiny")
        r = subprocess.run([a.bin, "make-tiny", "--out", model], capture_output=True, text=True)
        check(r.returncode == 0, "make-tiny failed: " + r.stderr)
    a.model_dir = model
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([a.bin, "serve", "--model", model, "--port", str(port), "--api-key", KEY,
                             "--kv-cache", os.path.join(tmp, "kv"), "--expert-slots", "2", "--kv-budget-bytes", "4000000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(600):
            if proc.poll() is not None:
                fail("server exited: " + proc.stdout.read())
            try:
                urllib.request.urlopen(base + "/health", timeout=1); break
            except Exception:
                time.sleep(0.1)
        else:
            fail("server did not start")
        run(a, base, tmp)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, base, tmp):
    # The page: static, embedded, served without a key; no network resources.
    st, ctype, page = get(base, "/")
    check(st == 200 and ctype.startswith("text/html"), f"GET / -> {st} {ctype}")
    page = page.decode()
    check('id="v_decode_tok_s"' in page and "/dashboard/dashboard.js" in page, "GET / is not the dashboard page")
    check("http://" not in page and "https://" not in page, "the page refers to the network")
    for path in ("/dashboard/dashboard.js", "/dashboard/dashboard.css", "/dashboard/chart.js"):
        st, _, body = get(base, path)
        check(st == 200 and len(body) > 0, f"GET {path} -> {st}")
    # The data: behind --api-key.
    st, _, _ = get(base, "/v1/stats")
    check(st == 401, f"/v1/stats without the key -> {st}, expected 401")
    st, _, _ = get(base, "/v1/stats", "wrong")
    check(st == 401, f"/v1/stats with a wrong key -> {st}, expected 401")

    s0 = stats(base)
    check(s0["backend"] == "cpu", "backend " + str(s0["backend"]))
    check(s0["requests"]["total"] == 0 and s0["tokens"]["emitted"] == 0, "a fresh server has counts")
    check(s0["derived"]["step_ms"] is None, "step_ms before any step should be null")
    chat(base, 6)
    chat(base, 6)  # the same prompt again: the disk KV cache restores it
    s1 = stats(base)
    check(s1["requests"]["total"] == 2, "requests.total " + str(s1["requests"]["total"]))
    check(s1["tokens"]["emitted"] > 0 and s1["tokens"]["generated"] == s1["tokens"]["emitted"], "tokens after two requests: " + str(s1["tokens"]))
    check(s1["steps"]["count"] > 0 and s1["derived"]["step_ms"] > 0, "no steps counted")
    check(s1["derived"]["ttft_ms"] is not None and s1["derived"]["ttft_ms"] > 0, "no time to first token")
    check(s1["uptime_s"] > s0["uptime_s"], "uptime does not advance")
    check(s1["kv_cache"] is not None and s1["kv_cache"]["hits"] >= 1, "disk KV cache hits: " + str(s1["kv_cache"]))
    check(s1["expert_tiers"] is not None and s1["expert_tiers"]["slot_hits"] + s1["expert_tiers"]["slot_misses"] > 0,
          "expert tier counters: " + str(s1["expert_tiers"]))
    # The executor's counters (model::Executor::stats): expert traffic by supplying tier, each
    # lookup once; bytes per token over the steps' rows; op times for every step it ran.
    x = s1["expert_traffic"]
    check(x is not None and set(x) == {"hbm", "host", "drive"}, "expert traffic by tier: " + str(x))
    lookups = sum(x[t]["lookups"] for t in x)
    # The engine's steps only (the tiers' raw counters also saw DSpark's verify-cost calibration).
    check(0 < lookups <= s1["expert_tiers"]["slot_hits"] + s1["expert_tiers"]["slot_misses"],
          f"expert lookups {lookups} vs the tiers' {s1['expert_tiers']}")
    check(x["drive"]["lookups"] > 0 and x["drive"]["bytes"] > 0, "a cold start reads experts from the drives: " + str(x))
    bpt = s1["derived"]["expert_bytes_per_token"]
    for t in ("hbm", "host", "drive"):
        want = x[t]["bytes"] / s1["steps"]["rows"]
        check(abs(bpt[t] - want) <= 1e-9 * max(1.0, want), f"bytes/token {t}: {bpt[t]} vs {want}")
    check(abs(s1["derived"]["expert_hbm_hit_rate"] - x["hbm"]["lookups"] / lookups) < 1e-12, "HBM hit rate")
    ot = s1["op_time"]
    check(ot is not None and ot["steps"] == s1["steps"]["count"], f"op times over {ot and ot['steps']} steps, the engine ran {s1['steps']['count']}")
    check(ot["calls"]["head"] == ot["steps"] and ot["calls"]["moe"] > ot["steps"], "op calls: " + str(ot["calls"]))
    check(ot["seconds"]["moe"] > 0 and ot["seconds"]["attention"] > 0, "op times by family: " + str(ot["seconds"]))
    check(sum(ot["seconds"].values()) <= s1["steps"]["seconds"] * 1.01 + 1e-3,
          f"op times {sum(ot['seconds'].values())} s exceed the step time {s1['steps']['seconds']} s")
    # Engram rows: per row of every step, orders x heads rows per Engram layer (the model's config);
    # the CPU fetches every one, hidden (staged before its layer) or exposed.
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)  # the released layout nests the text model's keys
    rows_per_token = len(cfg["engram_layer_ids"]) * (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
    eg = s1["engram"]
    check(eg is not None and eg["rows"] == s1["steps"]["rows"] * rows_per_token,
          f"Engram rows {eg and eg['rows']} for {s1['steps']['rows']} rows x {rows_per_token}")
    check(eg["bytes"] == eg["rows"] * (cfg["engram_head_dim"] + cfg["engram_head_dim"] // 32), "Engram bytes: " + str(eg))
    check(eg["hidden"] + eg["exposed"] == eg["rows"] and eg["in_place"] == 0, "Engram rows hidden + exposed: " + str(eg))
    check(eg["hidden"] > 0, "no Engram row was fetched ahead of its layer: " + str(eg))
    check(abs(s1["derived"]["engram_hidden_share"] - eg["hidden"] / eg["rows"]) < 1e-12, "Engram hidden share")
    check(abs(s1["derived"]["engram_rows_per_token"] - rows_per_token) < 1e-9, "Engram rows per token: " + str(s1["derived"]["engram_rows_per_token"]))
    check(s1["ledger"]["host"] is not None and s1["ledger"]["host"]["target_bytes"] == 4000000000, "host ledger: " + str(s1["ledger"]))
    check(s1["ledger"]["HBM"] is None, "the CPU executor has no HBM ledger")
    # The executor's memory by tier: host weights are the snapshot's tensors without the routed
    # experts (the tiers serve them, --expert-slots), read from the safetensors headers here; the
    # parts add up; the drives' bytes are the expert traffic's; no HBM on the CPU.
    mem = s1["memory"]
    check(mem["hbm"] is None, "the CPU executor reports HBM memory: " + str(mem["hbm"]))
    h = mem["host"]
    want_weights = 0
    for fn in sorted(os.listdir(a.model_dir)):
        if fn.endswith(".safetensors"):
            with open(os.path.join(a.model_dir, fn), "rb") as f:
                hdr = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            want_weights += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items()
                                if k != "__metadata__" and ".ffn.experts." not in k)
    check(h is not None and h["weights_bytes"] == want_weights, f"host weights {h and h['weights_bytes']}, the shards hold {want_weights} B besides the experts")
    check(h["weight_copies_bytes"] > 0 and h["scratch_bytes"] > 0 and h["experts_bytes"] > 0, "host memory parts: " + str(h))
    check(h["sessions"] >= 1 and h["sessions_bytes"] > 0, "live sessions in the ledger: " + str(h))
    check(h["total_bytes"] == h["weights_bytes"] + h["weight_copies_bytes"] + h["sessions_bytes"] + h["scratch_bytes"] + h["experts_bytes"],
          "host total is the sum of its parts: " + str(h))
    check(mem["drive"] is not None and mem["drive"]["expert_bytes_read"] == x["drive"]["bytes"] and mem["drive"]["engram_bytes_read"] is None,
          "drive bytes read: " + str(mem["drive"]) + " vs expert traffic " + str(x["drive"]))
    check(s1["dspark"] is not None and s1["dspark"]["rounds"] + s1["dspark"]["backoff_steps"] > 0, "DSpark counters: " + str(s1["dspark"]))
    chat(base, 6, text="Another prompt, so the totals move.")
    s2 = stats(base)
    check(s2["tokens"]["emitted"] > s1["tokens"]["emitted"], "tokens emitted did not increase")
    check(s2["steps"]["count"] > s1["steps"]["count"], "steps did not increase")
    print(f"json: ok ({s2['tokens']['emitted']} tokens in {s2['requests']['total']} requests, "
          f"{s2['derived']['step_ms']:.1f} ms/step)")

    if shutil.which("chromium") is None:
        print("SKIP: chromium is not installed (Debian: apt-get install chromium), so the page was not rendered; "
              "the JSON part passed")
        sys.exit(77)
    # A request streams while the page renders: the page must show it as an active session.
    streaming = threading.Thread(target=lambda: chat(base, 40, stream=True, text="Tell me a long story."), daemon=True)
    streaming.start()
    for _ in range(600):
        if stats(base)["requests"]["active"] >= 1:
            break
        time.sleep(0.05)
    else:
        fail("the streaming request never became active")
    dom = chromium(base + "/#key=" + KEY, os.path.join(tmp, "chromium1"), "--dump-dom")
    check('data-state="live"' in dom, "the page is not live: status " + dom_text(dom, "status"))
    updates = int(dom_text(dom, "updates"))
    check(updates >= 2, f"the page polled {updates} times, expected at least 2")
    emitted = int(dom_text(dom, "v_emitted").replace(",", ""))
    check(emitted >= s2["tokens"]["emitted"], f"the page shows {emitted} tokens, /v1/stats had {s2['tokens']['emitted']} before")
    check(dom_text(dom, "v_requests") == "4", "requests on the page: " + dom_text(dom, "v_requests"))
    check(dom_text(dom, "v_active") == "1", "active sessions on the page: " + dom_text(dom, "v_active"))
    check(re.search(r"<tbody><tr><td>\d+</td>", dom) is not None, "the sessions table has no active request")
    check(re.fullmatch(r"[\d.,]+", dom_text(dom, "v_step_ms")) is not None, "step time: " + dom_text(dom, "v_step_ms"))
    check(dom_text(dom, "v_kv_hits") not in ("-", "n/a"), "KV cache hits: " + dom_text(dom, "v_kv_hits"))
    check(dom_text(dom, "v_slot_hit_rate").endswith("%"), "expert slot hit rate: " + dom_text(dom, "v_slot_hit_rate"))
    # The breakdowns: bytes per token by tier and step time by op family, as tables and stacked bars.
    byte_re = r"[\d.]+ (B|KB|MB|GB|TB)"
    # The memory ledger cards: the executor's bytes by tier and use, the KV admission ledger, the
    # drives; on the CPU the host tier, and "n/a" for every part of HBM.
    mem_parts = ("", "_weights", "_weight_copies", "_sessions", "_n_sessions", "_scratch", "_experts")
    for el in ["v_mem_hbm" + p for p in mem_parts] + ["v_ledger_hbm"]:
        check(dom_text(dom, el) == "n/a", f"{el} on the CPU: " + dom_text(dom, el))
    for el in ["v_mem_host" + p for p in mem_parts if p != "_n_sessions"] + ["v_mem_drive"]:
        check(re.fullmatch(byte_re, dom_text(dom, el)) is not None, f"{el} on the page: " + dom_text(dom, el))
    for el, key in (("v_mem_host_weights", "weights_bytes"), ("v_mem_host_weight_copies", "weight_copies_bytes")):  # constant while serving
        shown, want = dom_text(dom, el).split(), js_bytes(h[key]).split()
        check(shown[1] == want[1] and abs(float(shown[0]) - float(want[0])) <= 0.051,  # toFixed and Python may round a tie apart
              f"{el} on the page {' '.join(shown)}, /v1/stats {key} {' '.join(want)}")
    check(re.fullmatch(r"[\d,]+", dom_text(dom, "v_mem_host_n_sessions")) is not None and int(dom_text(dom, "v_mem_host_n_sessions").replace(",", "")) >= 1,
          "live sessions on the page: " + dom_text(dom, "v_mem_host_n_sessions"))
    check(re.fullmatch(byte_re + " / 4.0 GB", dom_text(dom, "v_ledger_host")) is not None, "KV admission ledger on the page: " + dom_text(dom, "v_ledger_host"))
    check(re.fullmatch(byte_re, dom_text(dom, "v_bpt_total")) is not None, "bytes per token: " + dom_text(dom, "v_bpt_total"))
    for t in ("hbm", "host", "drive"):
        check(re.fullmatch(byte_re, dom_text(dom, f"tier_{t}_1")) is not None, f"{t} bytes/token on the page: " + dom_text(dom, f"tier_{t}_1"))
        check(dom_text(dom, f"tier_{t}_2").endswith("%"), f"{t} share: " + dom_text(dom, f"tier_{t}_2"))
    check(re.fullmatch(r"[\d,]+", dom_text(dom, "tier_drive_3")) is not None, "drive lookups on the page: " + dom_text(dom, "tier_drive_3"))
    check(dom_text(dom, "tier_hbm_4").endswith("%"), "HBM hit rate in the table: " + dom_text(dom, "tier_hbm_4"))
    moe_ms = float(dom_text(dom, "op_moe_1").replace(",", ""))
    check(moe_ms > 0, "MoE ms/step on the page: " + dom_text(dom, "op_moe_1"))
    check(dom_text(dom, "op_attention_2").endswith("%"), "attention share: " + dom_text(dom, "op_attention_2"))
    for stack in ("op_stack", "tier_stack"):
        check(re.search(r'id="' + stack + r'"><div [^>]*width: [\d.]+%', dom) is not None, "no stacked bar segments in #" + stack)
    check(dom_text(dom, "v_engram_hidden").endswith("%") and dom_text(dom, "v_engram_exposed").endswith("%"),
          "Engram hidden / exposed on the page: " + dom_text(dom, "v_engram_hidden") + " / " + dom_text(dom, "v_engram_exposed"))
    check(float(dom_text(dom, "v_engram_rows_tok")) == rows_per_token, "Engram rows per token on the page: " + dom_text(dom, "v_engram_rows_tok"))
    check(re.fullmatch(r"[\d.,]+", dom_text(dom, "v_engram_wait_ms")) is not None, "Engram wait on the page: " + dom_text(dom, "v_engram_wait_ms"))
    check(dom_text(dom, "charts_by") != "-", "the charts were not set up")
    print(f"dom: ok ({updates} polls, {emitted} tokens, step {dom_text(dom, 'v_step_ms')} ms, MoE {moe_ms} ms/step, "
          f"expert bytes/token {dom_text(dom, 'v_bpt_total')}, charts: {dom_text(dom, 'charts_by')})")
    # Without the key the page asks for one instead of showing numbers.
    dom = chromium(base + "/", os.path.join(tmp, "chromium2"), "--dump-dom")
    check('data-state="error"' in dom and dom_text(dom, "status") == "API key needed", "without a key: " + dom_text(dom, "status"))
    # The screenshot, kept as the test's artifact.
    out = a.artifacts or os.path.join(tmp, "artifacts")
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "dashboard.png")
    chromium(base + "/#key=" + KEY, os.path.join(tmp, "chromium3"), "--screenshot=" + png)
    check(os.path.exists(png) and os.path.getsize(png) > 20000, "no screenshot (or a blank one) at " + png)
    print("screenshot: " + png)

    # The HBM tier as the CUDA executor reports it (model::MemoryByTier has_hbm; this CPU server
    # has none): the same page, /v1/stats answered with the last live JSON plus an HBM tier and an
    # HBM KV ledger, the host tier and the drives not reported. Each HBM part shows at its id
    # (sizes picked away from rounding ties), the host card and the drives show "n/a".
    canned = json.loads(json.dumps(s2))
    hbm = {"weights_bytes": 71234000000, "weight_copies_bytes": 1876000000, "sessions_bytes": 3456000000, "sessions": 3,
           "scratch_bytes": 512300000, "experts_bytes": 9870000000}
    hbm["total_bytes"] = sum(v for k, v in hbm.items() if k.endswith("_bytes"))
    canned["memory"] = {"hbm": hbm, "host": None, "drive": None}
    canned["ledger"] = {"HBM": {"owner": "session KV", "target_bytes": 20000000000, "mandatory_bytes": 1500000000, "elastic_bytes": 240000000},
                        "host": None}
    fake = CannedStats(base, canned)
    try:
        dom = chromium(fake.base + "/#key=" + KEY, os.path.join(tmp, "chromium4"), "--dump-dom")
        check('data-state="live"' in dom, "the page on the stand-in /v1/stats is not live: status " + dom_text(dom, "status"))
        want = {"v_mem_hbm": "86.9 GB", "v_mem_hbm_weights": "71.2 GB", "v_mem_hbm_weight_copies": "1.9 GB", "v_mem_hbm_sessions": "3.5 GB",
                "v_mem_hbm_n_sessions": "3", "v_mem_hbm_scratch": "512.3 MB", "v_mem_hbm_experts": "9.9 GB", "v_ledger_hbm": "1.7 GB / 20.0 GB"}
        want.update({"v_mem_host" + p: "n/a" for p in mem_parts})
        want.update({"v_ledger_host": "n/a", "v_mem_drive": "n/a"})
        for el, text in want.items():
            check(dom_text(dom, el) == text, f"{el} with an HBM tier reported: {dom_text(dom, el)!r}, expected {text!r}")
        png = os.path.join(out, "dashboard_hbm.png")
        chromium(fake.base + "/#key=" + KEY, os.path.join(tmp, "chromium5"), "--screenshot=" + png)
        check(os.path.exists(png) and os.path.getsize(png) > 20000, "no screenshot (or a blank one) at " + png)
    finally:
        fake.close()
    print(f"hbm: ok (HBM {want['v_mem_hbm']}: weights {want['v_mem_hbm_weights']}, copies {want['v_mem_hbm_weight_copies']}, "
          f"sessions {want['v_mem_hbm_sessions']} ({want['v_mem_hbm_n_sessions']}), scratch {want['v_mem_hbm_scratch']}, "
          f"experts {want['v_mem_hbm_experts']}; host n/a); screenshot: {png}")
    streaming.join(300)
    print("PASS")


if __name__ == "__main__":
    main()
