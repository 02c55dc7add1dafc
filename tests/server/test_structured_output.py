#!/usr/bin/env python3
"""Structured output on every API and tool_choice allowed_tools, through `flashbox serve` on the
built-in tiny model (random weights) and the official openai / anthropic SDKs (issue 27).

Part 1: Chat response_format json_schema and json_object (plain and streamed), the openai SDK's
own `chat.completions.parse` with a pydantic model, legacy Completions `response_format` (vLLM's
extension), Anthropic `output_config.format` (plain, streamed, and the SDK's `messages.parse` with a
pydantic model); every answer that ends with "stop" must parse and validate against its schema,
and with the schemas' closed value sets every answer must end with "stop". Bad formats are 400s
naming the field.
Part 2: tool_choice allowed_tools (Chat's nested shape, Responses' flat one): under "required" every
call names a listed function; under "auto" any call does; an unknown name, an empty list, a
non-function entry and a bad mode are 400s naming the problem. Also through the SDKs: a named
function on Responses, a strict tool on Anthropic Messages.
Part 3: presence and frequency penalties change greedy output exactly where the raw model's top-20
logprobs (returned unchanged) say they must: the first position at which the penalized argmax
differs from the unpenalized token is predicted from the first run, and the penalized run must
agree up to it and take the predicted token there.
"""
import collections, json, os, sys
from typing import Literal

from serve_util import Server, tiny_model, Checks, bin_and_model  # noqa: E402 (tests/server/, beside this file)

try:
    import openai, anthropic, pydantic
except ImportError as e:
    print(f"FAIL: python packages missing ({e}); tools/test.sh installs them into build/pyenv")
    sys.exit(1)

NO_THINK = {"thinking": {"type": "disabled"}}
# Closed value sets: a random model's value ends within a few tokens.
SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 9},
    "unit": {"enum": ["c", "f"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2},
    "name": {"type": "string", "maxLength": 6}},
    "required": ["ok", "n", "unit", "tags", "name"], "additionalProperties": False}
check = Checks()


def valid(v):
    """SCHEMA, checked by hand."""
    return (isinstance(v, dict) and set(v) == {"ok", "n", "unit", "tags", "name"} and isinstance(v["ok"], bool)
            and isinstance(v["n"], int) and not isinstance(v["n"], bool) and 0 <= v["n"] <= 9 and v["unit"] in ("c", "f")
            and isinstance(v["tags"], list) and len(v["tags"]) <= 2 and all(t in ("a", "b", "c") for t in v["tags"])
            and isinstance(v["name"], str) and len(v["name"]) <= 6)


def parses_valid(text):
    try:
        return valid(json.loads(text))
    except (TypeError, ValueError):
        return False


class Answer(pydantic.BaseModel):  # the SDKs' parse helpers turn it into a strict schema
    ok: bool
    unit: Literal["c", "f"]
    level: Literal[1, 2, 3]


def structured(oa, an):
    # The checker must be able to say no.
    check(not parses_valid('{"ok": true, "n": 12, "unit": "c", "tags": [], "name": ""}') and not parses_valid("{") and
          parses_valid('{"ok": false, "n": 3, "unit": "f", "tags": ["a"], "name": "xy"}'), "validator self-check")
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA}}
    for seed in range(4):
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Report {seed}"}], response_format=rf,
                                       max_tokens=120, seed=seed, extra_body=NO_THINK)
        c = r.choices[0]
        check(c.finish_reason == "stop" and parses_valid(c.message.content), f"chat json_schema seed {seed}: {c.finish_reason} {c.message.content!r}")
    text, fin = "", None
    for ch in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Report"}], response_format=rf, max_tokens=120,
                                         seed=9, stream=True, extra_body=NO_THINK):
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
        if ch.choices and ch.choices[0].finish_reason:
            fin = ch.choices[0].finish_reason
    check(fin == "stop" and parses_valid(text), f"chat json_schema streamed: {fin} {text!r}")
    # json_object: any object; a random model's members are free, so only a finished answer is judged.
    n_obj = 0
    for seed in range(3):
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Object"}], response_format={"type": "json_object"},
                                       max_tokens=200, seed=seed, extra_body=NO_THINK)
        c = r.choices[0]
        if c.finish_reason == "stop":
            n_obj += 1
            try:
                ok = isinstance(json.loads(c.message.content), dict)
            except ValueError:
                ok = False
            check(ok, f"chat json_object seed {seed}: an object ({c.message.content!r})")
        else:
            check(c.finish_reason == "length" and c.message.content.lstrip().startswith("{"),
                  f"chat json_object seed {seed}: cut by max_tokens inside the object ({c.message.content[:60]!r})")
    print(f"json_object: {n_obj} of 3 finished within 200 tokens")
    # The openai SDK's parse helper: a pydantic model as the response_format, parsed by the SDK.
    for seed in range(2):
        p = oa.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Parse me"}], response_format=Answer, max_tokens=80,
                                      seed=seed, extra_body=NO_THINK)
        m = p.choices[0].message
        check(p.choices[0].finish_reason == "stop" and isinstance(m.parsed, Answer), f"openai parse seed {seed}: {m.content!r} -> {m.parsed!r}")
    # Legacy Completions: response_format as vLLM accepts it; the value starts at the first token.
    for seed in range(2):
        r = oa.completions.create(model="m", prompt="The report:", max_tokens=120, seed=seed, extra_body={"response_format": rf})
        c = r.choices[0]
        check(c.finish_reason == "stop" and parses_valid(c.text), f"completions response_format seed {seed}: {c.finish_reason} {c.text!r}")
    try:
        oa.completions.create(model="m", prompt="x", max_tokens=4, extra_body={"response_format": {"type": "yaml"}})
        check(False, "completions response_format yaml must be refused")
    except openai.BadRequestError as e:
        check("'response_format.type'" in str(e), f"completions response_format yaml -> 400 naming it: {e}")

    # Anthropic Messages: output_config.format (always strict), plain and streamed.
    oc = {"format": {"type": "json_schema", "schema": SCHEMA}}
    for i in range(3):
        m = an.messages.create(model="m", max_tokens=120, messages=[{"role": "user", "content": f"Report {i}"}], output_config=oc,
                               thinking={"type": "disabled"}, extra_body={"seed": i})
        text = "".join(b.text for b in m.content if b.type == "text")
        check(m.stop_reason == "end_turn" and parses_valid(text), f"anthropic output_config.format {i}: {m.stop_reason} {text!r}")
    text, stop = "", None
    with an.messages.stream(model="m", max_tokens=120, messages=[{"role": "user", "content": "Report"}], output_config=oc,
                            thinking={"type": "disabled"}, extra_body={"seed": 5}) as s:
        for t in s.text_stream:
            text += t
        stop = s.get_final_message().stop_reason
    check(stop == "end_turn" and parses_valid(text), f"anthropic output_config.format streamed: {stop} {text!r}")
    for i in range(2):
        pm = an.messages.parse(model="m", max_tokens=80, messages=[{"role": "user", "content": "Parse me"}], output_format=Answer,
                               thinking={"type": "disabled"}, extra_body={"seed": i})
        check(pm.stop_reason == "end_turn" and isinstance(pm.parsed_output, Answer), f"anthropic messages.parse {i}: {pm.parsed_output!r}")
    for fmt, needle in (({"type": "json_object"}, "output_config.format.type"),
                        ({"type": "json_schema", "schema": {"type": "string", "pattern": "^a"}}, "output_config.format schema at '/': keyword 'pattern'")):
        try:
            an.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}], output_config={"format": fmt})
            check(False, f"anthropic output_config.format {fmt} must be refused")
        except anthropic.BadRequestError as e:
            check(needle in str(e), f"anthropic output_config.format {json.dumps(fmt)} -> 400 naming {needle}: {e}")


TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {p: {"enum": v}},
                                                                     "required": [p], "additionalProperties": False}}}
         for n, p, v in (("get_weather", "city", ["Oslo", "Lima"]), ("get_time", "tz", ["UTC", "CET"]), ("get_news", "topic", ["ai", "art"]))]


def allowed_tools(oa):
    tc = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}},
                                                                                   {"type": "function", "function": {"name": "get_news"}}]}}
    for seed in range(3):
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Weather {seed}?"}], tools=TOOLS, tool_choice=tc,
                                       max_tokens=200, seed=seed, extra_body=NO_THINK)
        calls = r.choices[0].message.tool_calls or []
        check(r.choices[0].finish_reason == "tool_calls" and calls and all(c.function.name in ("get_time", "get_news") for c in calls),
              f"chat allowed_tools required seed {seed}: {[(c.function.name, c.function.arguments) for c in calls]}")
    # Auto over one function: text, or calls of get_time only.
    for seed in range(2):
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Time?"}], tools=TOOLS, max_tokens=60, seed=seed,
                                       tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                                           {"type": "function", "function": {"name": "get_time"}}]}}, extra_body=NO_THINK)
        calls = r.choices[0].message.tool_calls or []
        check(all(c.function.name == "get_time" for c in calls), f"chat allowed_tools auto seed {seed}: {r.choices[0].finish_reason}, "
              f"{[c.function.name for c in calls]}")
    # Responses: the flat shape.
    rtools = [dict(t["function"], type="function") for t in TOOLS]
    # One call (parallel_tool_calls false) and a fixed seed: with parallel calls allowed and an unseeded sampler the
    # grammar may keep emitting calls until max_output_tokens, and the response is then (correctly) "incomplete".
    rr = oa.responses.create(model="m", input="News?", tools=rtools, max_output_tokens=200, reasoning={"effort": "none"},
                             parallel_tool_calls=False, extra_body={"seed": 0},
                             tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]})
    calls = [o for o in rr.output if o.type == "function_call"]
    check(rr.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather",
          f"responses allowed_tools required: {rr.status}, {[(c.name, c.arguments) for c in calls]}")
    check(rr.tool_choice.type == "allowed_tools", f"responses echoes the allowed_tools choice ({rr.tool_choice})")
    bad = [({"mode": "required", "tools": [{"type": "function", "function": {"name": "get_stock"}}]}, "'get_stock', which is not in 'tools'"),
           ({"mode": "auto", "tools": []}, "is empty"),
           ({"mode": "auto", "tools": [{"type": "mcp", "server_label": "x"}]}, "\"mcp\""),
           ({"mode": "sometimes", "tools": [{"type": "function", "function": {"name": "get_time"}}]}, "'tool_choice.allowed_tools.mode'")]
    for at, needle in bad:
        try:
            oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "allowed_tools", "allowed_tools": at})
            check(False, f"allowed_tools {at} must be refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and needle in str(e), f"allowed_tools {json.dumps(at)} -> 400 naming {needle}: {e}")


def more_tools(oa, an):
    rtools = [dict(t["function"], type="function") for t in TOOLS]
    rr = oa.responses.create(model="m", input="Time?", tools=rtools, max_output_tokens=200, reasoning={"effort": "none"},
                             tool_choice={"type": "function", "name": "get_time"}, extra_body={"seed": 1})
    calls = [o for o in rr.output if o.type == "function_call"]
    check(rr.status == "completed" and len(calls) == 1 and calls[0].name == "get_time" and
          json.loads(calls[0].arguments).get("tz") in ("UTC", "CET"), f"responses named function: {[(c.name, c.arguments) for c in calls]}")
    atools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"], "strict": True} for t in TOOLS]
    m = an.messages.create(model="m", max_tokens=200, tools=atools, thinking={"type": "disabled"}, extra_body={"seed": 3},
                           tool_choice={"type": "any", "disable_parallel_tool_use": True}, messages=[{"role": "user", "content": "News?"}])
    tu = [b for b in m.content if b.type == "tool_use"]
    ok = m.stop_reason == "tool_use" and len(tu) == 1
    for b in tu:
        props = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in TOOLS}[b.name]
        (key, spec), = props.items()
        ok = ok and set(b.input) == {key} and b.input[key] in spec["enum"]
    check(ok, f"anthropic strict tool under any: {m.stop_reason} {[(b.name, b.input) for b in tu]}")
    for seed in range(2):  # auto: text, or calls whose arguments hold to the strict schemas
        m = an.messages.create(model="m", max_tokens=60, tools=atools, thinking={"type": "disabled"}, extra_body={"seed": seed},
                               messages=[{"role": "user", "content": "Hello"}])
        tu = [b for b in m.content if b.type == "tool_use"]
        check(all(len(b.input) == 1 for b in tu), f"anthropic strict tool under auto seed {seed}: {m.stop_reason}, {[(b.name, b.input) for b in tu]}")


def penalties(oa):
    """Greedy with and without presence/frequency penalties, the divergence predicted from raw logprobs."""
    pres, freq = 1.5, 2.0
    tested = 0
    for prompt in ("The sky is", "Once upon a time", "1, 2, 3,", "def f(x):"):
        r0 = oa.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0, logprobs=20)
        lp0 = r0.choices[0].logprobs
        toks, tops = lp0.tokens, lp0.top_logprobs
        pred = None
        for k in range(len(toks)):
            seen = collections.Counter(toks[:k])
            scores = sorted(((lp - pres * (seen[t] > 0) - freq * seen[t], t) for t, lp in tops[k].items()), reverse=True)
            if scores[0][1] != toks[k]:
                # Decidable only with a clear winner that no token outside the top 20 can beat.
                if scores[0][0] - scores[1][0] > 1e-3 and scores[0][0] > min(tops[k].values()) + 1e-3 and len(set(tops[k])) == len(tops[k]):
                    pred = (k, scores[0][1])
                break
        if not pred:
            print(f"penalties: no decidable divergence for {prompt!r} ({toks})")
            continue
        k, tok = pred
        r1 = oa.completions.create(model="m", prompt=prompt, max_tokens=k + 1, temperature=0, logprobs=20,
                                   presence_penalty=pres, frequency_penalty=freq)
        t1 = r1.choices[0].logprobs.tokens
        check(t1[:k] == toks[:k] and len(t1) > k and t1[k] == tok,
              f"penalties on {prompt!r}: same {k} tokens, then the predicted {tok!r} (got {t1[k] if len(t1) > k else None!r})")
        raw = all(abs(r1.choices[0].logprobs.top_logprobs[i][t] - tops[i][t]) < 1e-5 for i in range(k) for t in tops[i])
        check(raw, f"penalties on {prompt!r}: returned logprobs are the raw model's")
        tested += 1
    check(tested >= 1, f"penalties: {tested} prompts with a decidable divergence")


def main():
    binary, model = bin_and_model()
    srv = Server(binary, ["--model", model])
    try:
        structured(srv.oa(300), srv.an(300))
        allowed_tools(srv.oa(300))
        more_tools(srv.oa(300), srv.an(300))
        penalties(srv.oa(300))
    finally:
        srv.close()
    check.finish()


if __name__ == "__main__":
    main()
