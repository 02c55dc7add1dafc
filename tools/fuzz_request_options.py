#!/usr/bin/env python3
"""Fuzz of the request options of issue 27 against `flashbox serve` (by hand; not a ctest).

Random requests for a fixed time: random JSON schemas over the supported keyword subset (plus
unsupported keywords and unsatisfiable schemas), response_format alone and beside tools, random
tool schemas and tool_choice forms (allowed_tools subsets and bad entries too), Responses
text.format, Anthropic output_config.format, Completions response_format, logit_bias, phrase_bias
(texts with markup, token ids, bad entries), penalties, streaming, all four APIs. Checks: every answer is 200 or 400 (never 5xx, a
dropped connection or a crash); a 200 under json_schema that finished "stop" holds a value that
validates (own validator of the subset; Chat, Completions, Messages, Responses); forced and strict
calls' arguments validate; allowed_tools calls name listed functions; the server is alive at the end. Prints counts and the first failures; exit 1 on any.

  build/pyenv/bin/python3 tools/fuzz_request_options.py --bin build/h27/flashbox --model tiny-model --minutes 10
"""
import argparse, json, random, re, socket, subprocess, sys, tempfile, time, urllib.error, urllib.request

MARKUP = ["<｜DSML｜", "｜DSML｜", "</think>", "<think>", "<｜end▁of▁sentence｜>", "<｜User｜>", "\n\n", " ", "é", "世界", "\x00", "\"", "\\"]


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


# ---- schemas over the subset docs/serving.md lists, and a validator for them ----

def rand_schema(rng, depth=0):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "anyOf", "array", "object"]
    if depth >= 2:
        kinds = kinds[:7]
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        if rng.random() < 0.4:
            lo = rng.randint(0, 3); s["minLength"] = lo; s["maxLength"] = lo + rng.randint(0, 6)
        return s
    if k in ("integer", "number"):
        s = {"type": k}
        if rng.random() < 0.6:
            lo = rng.randint(-50, 50); s["minimum"] = lo; s["maximum"] = lo + rng.randint(0, 100)
        return s
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        return {"enum": rng.sample(["a", "b", 1, 2.5, True, None, "x y", [1], {"k": 1}], rng.randint(1, 4))}
    if k == "const":
        return {"const": rng.choice(["c", 7, False, None, [1, 2], {"a": "b"}])}
    if k == "anyOf":
        return {"anyOf": [rand_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if k == "array":
        s = {"type": "array", "items": rand_schema(rng, depth + 1)}
        if rng.random() < 0.5:
            lo = rng.randint(0, 2); s["minItems"] = lo; s["maxItems"] = lo + rng.randint(0, 3)
        else:
            s["maxItems"] = rng.randint(0, 3)
        return s
    props = {f"p{i}": rand_schema(rng, depth + 1) for i in range(rng.randint(0, 4))}
    s = {"type": "object", "properties": props}
    if props and rng.random() < 0.7:
        s["required"] = rng.sample(sorted(props), rng.randint(0, len(props)))
    if rng.random() < 0.6:
        s["additionalProperties"] = False
    return s


def bad_schema(rng):
    s = rand_schema(rng)
    return rng.choice([
        dict(s, pattern="a+") if s.get("type") == "string" else {"type": "string", "format": "email"},
        {"oneOf": [s, {"type": "null"}]}, {"allOf": [s]}, {"not": s}, {"type": "array", "uniqueItems": True},
        {"enum": []}, {"type": "integer", "minimum": 5, "maximum": 4}, {"type": "integer", "minimum": 0.2, "maximum": 0.8},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False},
        {"type": "frobnicate"}, {"$ref": "#/$defs/missing"}, False, {"type": "object", "patternProperties": {"a": {}}}])


def valid(v, s, strict):
    if s is True or s == {}:
        return True
    if "const" in s:
        return v == s["const"] and type(v) == type(s["const"])
    if "enum" in s:
        return any(v == e and type(v) == type(e) for e in s["enum"])
    if "anyOf" in s:
        return any(valid(v, x, strict) for x in s["anyOf"])
    t = s.get("type")
    if t == "string":
        return isinstance(v, str) and s.get("minLength", 0) <= len(v) <= s.get("maxLength", 1 << 30)
    if t in ("integer", "number"):
        ok = isinstance(v, int) if t == "integer" else isinstance(v, (int, float))
        # Bounds only where the schema has them: an unbounded integer may have hundreds of digits.
        return ok and not isinstance(v, bool) and ("minimum" not in s or v >= s["minimum"]) and ("maximum" not in s or v <= s["maximum"])
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    if t == "array":
        return (isinstance(v, list) and s.get("minItems", 0) <= len(v) <= s.get("maxItems", 1 << 30)
                and all(valid(x, s.get("items", {}), strict) for x in v))
    if t == "object":
        if not isinstance(v, dict):
            return False
        props = s.get("properties", {})
        if any(r not in v for r in s.get("required", [])):
            return False
        extra_ok = s.get("additionalProperties", not strict) is not False
        return all(valid(x, props[k], strict) if k in props else extra_ok for k, x in v.items())
    return True


# ---- requests ----

def rand_phrase_bias(rng):
    if rng.random() < 0.1:
        return rng.choice(["x", 5, {"": 1}, {"a": 101}, [{"tokens": [-1], "bias": 1}], [{"tokens": [], "bias": 1}], [{"phrase": 1, "bias": 0}]])
    if rng.random() < 0.5:
        return {"".join(rng.choice(MARKUP + ["as", " an", " AI", "the", "ok"]) for _ in range(rng.randint(1, 4))): rng.uniform(-100, 100)
                for _ in range(rng.randint(1, 5))}
    return [{"tokens": [rng.randint(0, 129279) if rng.random() < 0.7 else rng.randint(0, 300) for _ in range(rng.randint(1, 5))],
             "bias": rng.choice([-100, -5, 0, 3, 100, rng.uniform(-100, 100)])} for _ in range(rng.randint(1, 6))]


def rand_tools(rng):
    tools = []
    for i in range(rng.randint(1, 3)):
        params = rand_schema(rng) if rng.random() < 0.2 else {"type": "object", "properties": {f"a{j}": rand_schema(rng, 1) for j in range(rng.randint(0, 3))}}
        if rng.random() < 0.05:
            params = bad_schema(rng)
        f = {"name": rng.choice([f"tool_{i}", f"t{i}", "bad\"name" if rng.random() < 0.05 else f"fn{i}"]), "parameters": params}
        if rng.random() < 0.4:
            f["strict"] = True
        tools.append(f)
    return tools


def rand_request(rng):
    api = rng.choice(["chat", "chat", "chat", "completions", "messages", "responses"])
    body = {"max_tokens": rng.randint(1, 40), "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 1 << 20)}
    notes = {"api": api}
    if rng.random() < 0.3:
        body["logit_bias"] = {str(rng.randint(0, 129279)): rng.uniform(-100, 100) for _ in range(rng.randint(1, 5))}
        if rng.random() < 0.1:
            body["logit_bias"] = {"999999": 1}
    if rng.random() < 0.5:
        body["phrase_bias"] = rand_phrase_bias(rng)
    if rng.random() < 0.3:
        body["presence_penalty"] = rng.uniform(-2, 2); body["frequency_penalty"] = rng.uniform(-2, 2)
    body["stream"] = rng.random() < 0.3
    if api == "completions":
        body["prompt"] = "The sky is"
        rf = None
        if rng.random() < 0.4:  # response_format on the legacy API (vLLM's extension)
            rf = rng.choice([{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "n", "schema": bad_schema(rng)}},
                             {"type": "json_schema", "json_schema": {"name": "n", "strict": rng.random() < 0.5, "schema": rand_schema(rng)}}])
            body["response_format"] = rf
            if rng.random() < 0.7:
                body["max_tokens"] = 200
        return api, body, dict(notes, rf=rf)
    think = rng.random() < 0.2
    body["thinking"] = {"type": "enabled" if think else "disabled"}
    msgs = [{"role": "user", "content": rng.choice(["Hi", "Weather?", "Give JSON", "x" * rng.randint(1, 50)])}]
    tools = rand_tools(rng) if rng.random() < 0.5 else []
    if api == "messages":
        body["messages"] = msgs
        if tools:
            body["tools"] = [{"name": t["name"], "input_schema": t["parameters"], **({"strict": True} if t.get("strict") else {})} for t in tools]
            body["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": tools[0]["name"]},
                                              {"type": "none"}, {"type": "tool", "name": "nope"}])
        rf = None
        if rng.random() < 0.4:  # Anthropic structured outputs: output_config.format (json_schema only, always strict)
            rf = rng.choice([{"type": "json_object"}, {"type": "json_schema", "schema": bad_schema(rng)},
                             {"type": "json_schema", "schema": rand_schema(rng)}])
            body["output_config"] = {"format": rf}
            if rng.random() < 0.7:
                body["max_tokens"] = 200
        return api, body, dict(notes, tools=tools, tool_choice=body.get("tool_choice"), rf=rf)
    if api == "responses":
        body["input"] = msgs[0]["content"]
        body["max_output_tokens"] = body.pop("max_tokens")
        if tools:
            body["tools"] = [dict(type="function", **t) for t in tools]
            body["tool_choice"] = rng.choice(["auto", "required", "none", {"type": "function", "name": tools[0]["name"]}])
        rf = None
        if rng.random() < 0.4:  # text.format: the json_schema fields flat
            rf = rng.choice([{"type": "json_object"}, {"type": "json_schema", "name": "n", "schema": bad_schema(rng)},
                             {"type": "json_schema", "name": "n", "strict": rng.random() < 0.5, "schema": rand_schema(rng)}])
            body["text"] = {"format": rf}
            if rng.random() < 0.7:
                body["max_output_tokens"] = 200
        return api, body, dict(notes, tools=tools, tool_choice=body.get("tool_choice"), rf=rf)
    body["messages"] = msgs
    if tools:
        body["tools"] = [{"type": "function", "function": t} for t in tools]
        body["tool_choice"] = rng.choice(["auto", "auto", "required", "none", {"type": "function", "function": {"name": tools[0]["name"]}},
                                          "allowed", "allowed"])
        if body["tool_choice"] == "allowed":  # a random subset, sometimes with a bad entry (a 400)
            names = rng.sample([t["name"] for t in tools], rng.randint(1, len(tools)))
            entries = [{"type": "function", "function": {"name": n}} for n in names]
            if rng.random() < 0.15:
                entries.append(rng.choice([{"type": "function", "function": {"name": "nope"}}, {"type": "mcp", "server_label": "x"},
                                           {"type": "function"}, "get"]))
            body["tool_choice"] = {"type": "allowed_tools", "allowed_tools": {"mode": rng.choice(["auto", "required", "required", "any"]),
                                                                              "tools": entries if rng.random() > 0.05 else []}}
    rf = None
    if rng.random() < 0.5:
        r = rng.random()
        if r < 0.15:
            rf = {"type": "json_object"}
        elif r < 0.25:
            rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": bad_schema(rng)}}
        else:
            rf = {"type": "json_schema", "json_schema": {"name": "n", "strict": rng.random() < 0.5, "schema": rand_schema(rng)}}
        body["response_format"] = rf
    if (rf or (tools and body["tool_choice"] != "none")) and rng.random() < 0.7:
        body["max_tokens"] = 200  # room for a whole value or call, so the checks below see some
    return api, body, dict(notes, tools=tools, tool_choice=body.get("tool_choice"), rf=rf)


def post(base, api, body, timeout=300):
    path = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages", "responses": "/v1/responses"}[api]
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer k", "x-api-key": "k"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


CHECKED = {"values": 0, "calls": 0}


def check_responses(body, notes, text):
    """A Responses answer under text.format that completed without a call holds a valid value."""
    j, rf = json.loads(text), notes.get("rf")
    calls = [o for o in j["output"] if o["type"] == "function_call"]
    if not rf or rf["type"] == "text" or calls or j["status"] != "completed" or (notes.get("tools") and notes.get("tool_choice") not in (None, "auto", "none")):
        return []
    out = "".join(c["text"] for o in j["output"] if o["type"] == "message" for c in o["content"])
    try:
        v = json.loads(out)
    except ValueError:
        return [f"text.format answer is not JSON: {out!r}"]
    CHECKED["values"] += 1
    if rf["type"] == "json_object" and not isinstance(v, dict):
        return ["text.format json_object answer is not an object"]
    if rf["type"] == "json_schema" and not valid(v, rf["schema"], rf.get("strict", False)):
        return [f"value {v!r} does not validate against {rf['schema']}"]
    return []


def check_value(text, rf, strict, where):
    """A finished answer under a format: parses, and validates against a json_schema."""
    try:
        v = json.loads(text)
    except ValueError:
        return [f"{where}: finished but not JSON: {text!r}"]
    CHECKED["values"] += 1
    if rf["type"] == "json_object" and not isinstance(v, dict):
        return [f"{where}: json_object answer is not an object"]
    schema = rf["json_schema"]["schema"] if "json_schema" in rf else rf.get("schema")
    if rf["type"] == "json_schema" and not valid(v, schema, strict):
        return [f"{where}: value {v!r} does not validate against {schema}"]
    return []


def check_answer(api, body, notes, text):
    """Problems with a 200 answer (non-streamed chat, completions, messages and responses: the fields to check are there)."""
    if api == "responses" and not body.get("stream"):
        return check_responses(body, notes, text)
    rf = notes.get("rf")
    if api == "completions" and not body.get("stream") and rf:
        c = json.loads(text)["choices"][0]
        strict = rf.get("json_schema", {}).get("strict", False)
        return check_value(c["text"], rf, strict, "completions") if c["finish_reason"] == "stop" else []
    if api == "messages" and not body.get("stream") and rf:
        j = json.loads(text)
        tc = notes.get("tool_choice") or {}
        if j["stop_reason"] != "end_turn" or any(b["type"] == "tool_use" for b in j["content"]) or tc.get("type") in ("any", "tool"):
            return []
        return check_value("".join(b["text"] for b in j["content"] if b["type"] == "text"), rf, True, "messages output_config.format")
    if api != "chat" or body.get("stream"):
        return []
    j = json.loads(text)
    c = j["choices"][0]
    probs = []
    calls = c["message"].get("tool_calls") or []
    tc, tools, rf = notes.get("tool_choice"), notes.get("tools") or [], notes.get("rf")
    allowed = tc["allowed_tools"] if isinstance(tc, dict) and tc.get("type") == "allowed_tools" else None
    forced = tools and (tc == "required" or isinstance(tc, dict) and tc.get("type") == "function" or (allowed and allowed["mode"] == "required"))
    if forced and c["finish_reason"] == "stop":
        probs.append("a forced call ended without a call")
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        t = next((t for t in tools if t["name"] == call["function"]["name"]), None)
        if allowed and call["function"]["name"] not in [e["function"]["name"] for e in allowed["tools"]]:
            probs.append(f"allowed_tools: a call of {call['function']['name']}, not listed")
        if t is None:
            probs.append(f"call of an unknown tool {call['function']['name']}")
        elif (forced or t.get("strict")) and (CHECKED.__setitem__("calls", CHECKED["calls"] + 1) or not valid(args, t["parameters"], True)):
            probs.append(f"arguments {args} do not validate against {t['parameters']}")
    if rf and not forced and not calls and c["finish_reason"] == "stop":  # the answer is the value
        try:
            v = json.loads(c["message"]["content"])
        except ValueError:
            return probs + [f"finish stop but content is not JSON: {c['message']['content']!r}"]
        CHECKED["values"] += 1
        if rf["type"] == "json_object" and not isinstance(v, dict):
            probs.append("json_object answer is not an object")
        if rf["type"] == "json_schema" and not valid(v, rf["json_schema"]["schema"], rf["json_schema"].get("strict", False)):
            probs.append(f"value {v!r} does not validate against {rf['json_schema']['schema']}")
    return probs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(port), "--api-key", "k"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(base + "/health", timeout=1); break
        except Exception:
            time.sleep(0.1)
    counts, failures, t_end, n = {}, [], time.time() + 60 * a.minutes, 0
    while time.time() < t_end and len(failures) < 20:
        api, body, notes = rand_request(rng)
        n += 1
        try:
            status, text = post(base, api, body)
        except Exception as e:  # dropped connection, timeout
            failures.append(f"request {n}: {type(e).__name__}: {e}: {json.dumps(body)[:400]}")
            if proc.poll() is not None:
                break
            continue
        counts[status] = counts.get(status, 0) + 1
        if status not in (200, 400):
            failures.append(f"request {n}: HTTP {status}: {text[:300]}: {json.dumps(body)[:400]}")
        elif status == 200:
            try:
                for p in check_answer(api, body, notes, text):
                    failures.append(f"request {n}: {p}: {json.dumps(body)[:400]}")
            except Exception as e:
                failures.append(f"request {n}: unreadable answer ({e}): {text[:300]}")
    alive = proc.poll() is None
    proc.terminate(); proc.wait(10)
    print(f"{n} requests in {a.minutes} min: " + ", ".join(f"HTTP {k}: {v}" for k, v in sorted(counts.items())) +
          f"; validated {CHECKED['values']} constrained values and {CHECKED['calls']} constrained calls"
          f"; server {'alive' if alive else 'DIED'} (log {log.name})")
    for f in failures[:20]:
        print("FAIL " + f)
    sys.exit(0 if alive and not failures else 1)


if __name__ == "__main__":
    main()
