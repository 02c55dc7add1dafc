#!/usr/bin/env python3
"""tool_choice forcing and strict tools through `flashbox serve` on the built-in tiny model (issue 27).

Random weights never call a tool on their own; under `tool_choice` required / a named function
(Anthropic: any / tool) the grammar makes every answer a call in the model's own DSML syntax, which
the server's parser turns into `tool_calls` (`tool_use` blocks) with arguments that validate
against the tool's schema. A name not among the tools, forcing without tools and an unsupported
form are 400s naming the problem. Uses the official openai and anthropic SDKs (build/pyenv).
"""
import json, os, socket, subprocess, sys, tempfile, time, urllib.request

from serve_util import Server, free_port, tiny_model, Checks, bin_and_model  # noqa: E402 (tests/server/, beside this file)

try:
    import openai, anthropic
except ImportError as e:
    print(f"FAIL: python packages missing ({e}); tools/test.sh installs them into build/pyenv")
    sys.exit(1)

PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "units": {"enum": ["c", "f"]}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                           "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}}}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
                   for t in TOOLS]
NO_THINK = {"thinking": {"type": "disabled"}}
check = Checks()


def weather_args_valid(args):
    return (isinstance(args, dict) and set(args) <= {"city", "days", "units"} and isinstance(args.get("city"), str)
            and len(args["city"]) <= 10 and isinstance(args.get("days"), int) and not isinstance(args["days"], bool)
            and 1 <= args["days"] <= 7 and args.get("units", "c") in ("c", "f"))


def time_args_valid(args):
    return isinstance(args, dict) and set(args) <= {"tz"} and args.get("tz", "UTC") in ("UTC", "CET")




def main():
    binary, model = bin_and_model()
    port = free_port()
    proc = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "--api-key", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                print("FAIL: server exited: " + proc.stdout.read()); sys.exit(1)
            try:
                urllib.request.urlopen(base + "/health", timeout=1); break
            except Exception:
                time.sleep(0.1)
        oa = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=300)
        an = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0, timeout=300)

        # Chat Completions, tool_choice "required": a call of one of the tools, finish_reason tool_calls.
        for seed in range(3):
            r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Weather or time {seed}?"}], tools=TOOLS,
                                           tool_choice="required", max_tokens=300, seed=seed, extra_body=NO_THINK)
            m, fin = r.choices[0].message, r.choices[0].finish_reason
            calls = m.tool_calls or []
            ok = fin == "tool_calls" and len(calls) >= 1
            for c in calls:
                args = json.loads(c.function.arguments)
                ok = ok and ((c.function.name == "get_weather" and weather_args_valid(args)) or (c.function.name == "get_time" and time_args_valid(args)))
            check(ok, f"chat required seed {seed}: finish {fin}, calls {[(c.function.name, c.function.arguments) for c in calls]}, content {m.content!r}")

        # A named function: exactly that tool, arguments valid against its schema; streamed too.
        for seed in range(3):
            r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS, seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=300, extra_body=NO_THINK)
            calls = r.choices[0].message.tool_calls or []
            check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
                  and weather_args_valid(json.loads(calls[0].function.arguments)),
                  f"chat named seed {seed}: {[(c.function.name, c.function.arguments) for c in calls]}")
        deltas, fin = [], None
        for ch in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "w?"}], tools=TOOLS, stream=True, seed=7,
                                             tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=300, extra_body=NO_THINK):
            if ch.choices and ch.choices[0].delta.tool_calls:
                deltas += ch.choices[0].delta.tool_calls
            if ch.choices and ch.choices[0].finish_reason:
                fin = ch.choices[0].finish_reason
        args = "".join(d.function.arguments or "" for d in deltas if d.function)
        check(fin == "tool_calls" and deltas and deltas[0].function.name == "get_time" and time_args_valid(json.loads(args)),
              f"chat stream named: finish {fin}, arguments {args!r}")

        # strict tools under auto: the request is accepted and constrained (text or a valid call).
        strict_tools = [{"type": "function", "function": dict(TOOLS[0]["function"], strict=True)}]
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], tools=strict_tools, max_tokens=40, seed=1,
                                       extra_body=NO_THINK)
        calls = r.choices[0].message.tool_calls or []
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls") and all(weather_args_valid(json.loads(c.function.arguments)) for c in calls),
              f"chat strict auto: finish {r.choices[0].finish_reason}, {len(calls)} calls")

        # Errors: a name not among the tools, forcing without tools, an unsupported form.
        for kw, needle in ((dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_news"}}), "'get_news'"),
                           (dict(tool_choice="required"), "no function tools"),
                           (dict(tools=TOOLS, tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}), "allowed_tools")):
            try:
                oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5, **kw)
                check(False, f"chat {kw.get('tool_choice')} must be refused")
            except openai.BadRequestError as e:
                check(needle in str(e), f"chat {json.dumps(kw.get('tool_choice'))} -> 400 naming {needle}: {e}")

        # Anthropic Messages: any / tool force a tool_use block; an unknown name is a 400 naming it.
        # one call (disable_parallel_tool_use): "any" alone lets random weights chain calls up to max_tokens
        m = an.messages.create(model="m", max_tokens=300, tools=ANTHROPIC_TOOLS, thinking={"type": "disabled"},
                               tool_choice={"type": "any", "disable_parallel_tool_use": True},
                               messages=[{"role": "user", "content": "Weather?"}])
        tu = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and tu and all((b.name == "get_weather" and weather_args_valid(b.input)) or
                                                         (b.name == "get_time" and time_args_valid(b.input)) for b in tu),
              f"messages any: stop {m.stop_reason}, {[(b.name, b.input) for b in tu]}")
        m = an.messages.create(model="m", max_tokens=300, tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                               thinking={"type": "disabled"}, messages=[{"role": "user", "content": "Weather?"}])
        tu = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(tu) == 1 and tu[0].name == "get_weather" and weather_args_valid(tu[0].input),
              f"messages tool: stop {m.stop_reason}, {[(b.name, b.input) for b in tu]}")
        try:
            an.messages.create(model="m", max_tokens=10, tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "lookup"},
                               messages=[{"role": "user", "content": "x"}])
            check(False, "messages unknown tool must be refused")
        except anthropic.BadRequestError as e:
            check("'lookup'" in str(e), f"messages tool 'lookup' -> 400 naming it: {e}")
    finally:
        proc.terminate()
        proc.wait(10)
    check.finish()


if __name__ == "__main__":
    main()
