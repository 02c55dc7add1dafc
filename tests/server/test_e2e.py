#!/usr/bin/env python3
"""End-to-end test of `flashbox serve` with the official openai and anthropic SDKs (issue 8).

Part 1 (scripted executor, a test double that emits given text through the real tokenizer,
decode, DSML parse and SSE path): tool-call round trips, thinking on/off, chat/responses/messages
streamed and not. Part 2 (the built-in tiny model, random weights): real generation through every
API. Part 3: 100 malformed/oversized requests all get 4xx and the server keeps serving.
Part 4 (issues 10, 21, `make-tiny --vision`): images through the OpenAI and Anthropic SDKs (generated
PNG data URLs / base64 blocks), bad images and network URLs -> 400, prefix reuse keyed on the
image; plus a full queue -> 429, a client disconnect cancelling a non-streaming request, SSE
keep-alives / pings during prefill and the /metrics token counters. Part 5 (issue 20): 8
concurrent SDK streams (measured prefill chunks, shared draft calls) each equal their solo run; a
closed stream frees its session; 429 and recovery.
Fails (exit 1) when the SDKs are not importable: tools/test.sh installs them into its virtual
environment (build/pyenv), which is the interpreter ctest runs this with.
"""
import argparse, base64, json, os, re, socket, struct, subprocess, sys, tempfile, time, urllib.request, urllib.error, zlib

from serve_util import Server, free_port, tiny_model  # noqa: E402 (tests/server/, beside this file)

try:
    import openai, anthropic
except ImportError as e:
    print(f"FAIL: python packages missing ({e}); tools/test.sh installs them into build/pyenv")
    sys.exit(1)

CALL = ('\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n'
        '<｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>\n'
        '<｜DSML｜ parameter name="days" string="false">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather for a city",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]


def make_png(w, h, seed):
    """A small RGB PNG (no imaging library needed)."""
    rows = b"".join(b"\x00" + bytes(((x * 7 + y * 13 + seed * 101 + c * 50) % 256) for x in range(w) for c in range(3)) for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def metric(srv, name):
    text = urllib.request.urlopen(srv.base + "/metrics", timeout=10).read().decode()
    m = re.search(r"^" + name + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def raw_post(srv, path, body, read=True):
    """POST over a plain socket; returns the socket (read=False) or the whole raw response."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer k\r\n"
               f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    if not read:
        return s
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    return out.decode("utf-8", "replace")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
    print("ok  ", msg)


def scripted_tests(binary):
    script = {"outputs": [
        "I should call the tool.</think>Checking." + CALL,       # 1 openai chat, thinking, tool call
        "It is sunny in Paris.",                                   # 2 openai chat, after tool result, chat mode
        "Plan.</think>Answer text.",                               # 3 openai chat stream, thinking
        "I should call the tool.</think>" + CALL,                  # 4 openai chat stream, tool call
        "Look up.</think>" + CALL,                                 # 5 anthropic tool_use
        "Sunny, 18 degrees.",                                      # 6 anthropic after tool_result, no thinking
        "Thinking hard.</think>Streamed answer.",                  # 7 anthropic stream with thinking
        "Responses reply.",                                        # 8 responses, no reasoning
        "R.</think>" + CALL,                                       # 9 responses stream, function call
        "one two three END four",                                  # 10 stop string
    ]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(script, f, ensure_ascii=False)
    srv = Server(binary, ["--scripted-output", f.name])
    try:
        oa, an = srv.oa(), srv.an()
        # 1-2: OpenAI tool-call round trip with thinking on, then the tool result back.
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        r = oa.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=200)
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "tool_calls", "chat: finish_reason tool_calls")
        check(m.tool_calls and m.tool_calls[0].function.name == "get_weather", "chat: tool call name")
        check(json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris", "days": 2}, "chat: typed arguments")
        check(getattr(m, "reasoning_content", None) == "I should call the tool." and m.content == "Checking.", "chat: reasoning and content split")
        msgs += [{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content,
                  "tool_calls": [tc.model_dump() for tc in m.tool_calls]},
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": '{"temp_c": 18}'}]
        r = oa.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=200,
                                       extra_body={"thinking": {"type": "disabled"}})
        check(r.choices[0].message.content == "It is sunny in Paris." and r.choices[0].finish_reason == "stop", "chat: answer after tool result (thinking off)")
        check(r.usage.prompt_tokens > 50 and r.usage.completion_tokens > 0, "chat: usage")
        # 3: streaming with reasoning.
        parts, reasoning, fin = [], [], None
        for ch in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                             stream_options={"include_usage": True}, max_tokens=100):
            if ch.choices:
                d = ch.choices[0].delta
                if d.content: parts.append(d.content)
                rc = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
                if rc: reasoning.append(rc)
                fin = ch.choices[0].finish_reason or fin
        check("".join(parts) == "Answer text." and "".join(reasoning) == "Plan." and fin == "stop", "chat stream: reasoning + content")
        # 4: streamed tool call.
        calls = []
        for ch in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "w?"}], tools=TOOLS, stream=True, max_tokens=200):
            if ch.choices and ch.choices[0].delta.tool_calls:
                calls += ch.choices[0].delta.tool_calls
            if ch.choices and ch.choices[0].finish_reason: fin = ch.choices[0].finish_reason
        check(calls and calls[0].function.name == "get_weather" and fin == "tool_calls", "chat stream: tool call")
        # 5-6: Anthropic tool_use round trip.
        a = an.messages.create(model="m", max_tokens=200, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "Weather?"}])
        tu = [b for b in a.content if b.type == "tool_use"]
        check(a.stop_reason == "tool_use" and tu and tu[0].input == {"city": "Paris", "days": 2}, "messages: tool_use block")
        check(any(b.type == "thinking" and b.thinking == "Look up." for b in a.content), "messages: thinking block")
        a2 = an.messages.create(model="m", max_tokens=200, tools=ANTHROPIC_TOOLS, thinking={"type": "disabled"}, messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [b.model_dump() for b in a.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id, "content": "18C"}]}])
        check(a2.content[0].type == "text" and a2.content[0].text == "Sunny, 18 degrees." and a2.stop_reason == "end_turn", "messages: answer after tool_result")
        # 7: Anthropic streaming with thinking.
        with an.messages.stream(model="m", max_tokens=200, messages=[{"role": "user", "content": "hi"}]) as st:
            final = st.get_final_message()
        check([b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "Streamed answer.", "messages stream: thinking + text")
        # 8-9: Responses.
        rr = oa.responses.create(model="m", input="hi", reasoning={"effort": "none"}, max_output_tokens=100)
        check(rr.output_text == "Responses reply." and rr.status == "completed", "responses: output_text")
        events = list(oa.responses.create(model="m", input="w?", tools=[{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
                                          stream=True, max_output_tokens=200))
        done = [e for e in events if e.type == "response.completed"]
        fc = [o for o in done[0].response.output if o.type == "function_call"] if done else []
        check(fc and fc[0].name == "get_weather", "responses stream: function_call item")
        # 10: stop string.
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "count"}], stop=["END"], max_tokens=50,
                                       extra_body={"thinking": {"type": "disabled"}})
        check(r.choices[0].message.content == "one two three " and r.choices[0].finish_reason == "stop", "chat: stop string")
        # Images on a model without a vision tower: 400 with that message, in both formats.
        img = {"type": "image_url", "image_url": {"url": data_url(make_png(8, 8, 0))}}
        try:
            oa.chat.completions.create(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "?"}, img]}], max_tokens=5)
            check(False, "image without a vision tower must fail")
        except openai.BadRequestError as e:
            check("model has no vision tower" in str(e), "chat: image on a text-only model -> 400 'model has no vision tower'")
        try:
            an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(make_png(8, 8, 0)).decode()}}]}])
            check(False, "anthropic image without a vision tower must fail")
        except anthropic.BadRequestError as e:
            check("model has no vision tower" in str(e), "messages: image on a text-only model -> 400")
        robustness(srv)
    finally:
        srv.close()
    # A full queue: 429 (OpenAI RateLimitError, Anthropic overloaded_error), not 400.
    srv = Server(binary, ["--scripted-output", f.name, "--max-queue", "0"])
    try:
        try:
            srv.oa().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5)
            check(False, "queue full must fail")
        except openai.RateLimitError as e:
            check(e.status_code == 429, "chat: full queue -> 429")
        try:
            srv.an().messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
            check(False, "queue full must fail (anthropic)")
        except anthropic.RateLimitError as e:
            check(e.status_code == 429 and "overloaded_error" in str(e.body), "messages: full queue -> 429 overloaded_error")
        try:
            srv.oa().chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 70000}], max_tokens=5)
            check(False, "context overflow must fail")
        except openai.BadRequestError:
            check(True, "context overflow stays 400 with a full queue")
    finally:
        srv.close()


def robustness(srv):
    bad = [(p, b) for p in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages") for b in [
        b"", b"{", b"null", b"[]", b"42", b'"str"', b'{"messages": 5}', b'{"messages": [1]}', b'{"messages": [{"role": 7}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
        b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}',
        b'{"messages": [{"role": "user", "content": {"a": 1}}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": "nope"}',
        b'{"messages": [{"role": "user", "content": "x"}], "thinking": 3}',
        b'{"prompt": 5}', b'{"input": 5}', b'{"max_tokens": 3, "messages": "x"}',
        b'\xff\xfe\x00garbage', b'{"messages": [{"role": "user", "content": "' + b'a ' * 200000 + b'"}]}',
        b'{"a":' * 5000 + b'1' + b'}' * 5000, b'{"messages": [{"role": "user", "content": "x"}], "n": 3}',
        b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}']]
    bad.append(("/v1/chat/completions", b"x" * (9 << 20)))  # oversized body
    codes = []
    for path, body in bad[:100]:
        req = urllib.request.Request(srv.base + path, data=body, headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
        try:
            urllib.request.urlopen(req, timeout=60); codes.append(200)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
            if e.code != 413:
                json.loads(e.read() or b"{}")  # a JSON error body
        except (ConnectionError, urllib.error.URLError):
            codes.append(413 if len(body) > (8 << 20) else -1)  # the server may close on an oversized upload
    check(len(codes) == 100 and all(400 <= c < 500 for c in codes), f"robustness: 100 malformed requests -> 4xx ({sorted(set(codes))})")
    try:
        urllib.request.urlopen(urllib.request.Request(srv.base + "/v1/models"), timeout=5)
        check(False, "auth required")
    except urllib.error.HTTPError as e:
        check(e.code == 401, "models without key -> 401")
    check(srv.oa().models.list().data[0].id, "server keeps serving after bad input")
    # A known path with the wrong method: 405 with an Allow header and a JSON error body (issue 27).
    for path, method, allow in (("/v1/chat/completions", "GET", "POST"), ("/v1/messages", "GET", "POST"), ("/v1/models", "POST", "GET")):
        req = urllib.request.Request(srv.base + path, data=b"{}" if method == "POST" else None, method=method,
                                     headers={"Authorization": "Bearer k"})
        code, hdr = 200, None
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            code, hdr = e.code, e.headers.get("Allow")
            json.loads(e.read() or b"{}")
        check(code == 405 and hdr == allow, f"{method} {path} -> 405 Allow: {allow} (got {code}, {hdr})")
    # An explicit max_tokens beyond the context: 400 naming the limit, as the OpenAI API answers.
    with srv.oa() as c:
        try:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=10**9)
            check(False, "max_tokens beyond the context must fail")
        except openai.BadRequestError as e:
            check("maximum context length" in str(e), "max_tokens 1e9 -> 400 naming the context limit")
    with srv.oa() as c:
        try:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 70000}], max_tokens=5)
            check(False, "context overflow must fail")
        except openai.BadRequestError as e:
            check("context" in str(e), "context overflow -> 400 with a message")


def kv_cache_restart_tests(binary, model):
    """Issue 21: a prompt served, the server stopped and started again on the same --kv-cache
    folder, the same conversation continued: the stored prefix is restored (cached_tokens) and the
    greedy answer equals a cold server's."""
    kv = tempfile.mkdtemp()
    msgs = [{"role": "user", "content": "Tell me about the sea and the sky in a few words."}]
    def ask(srv, m):
        return srv.oa().chat.completions.create(model="m", messages=m, max_tokens=8, temperature=0,
                                                extra_body={"thinking": {"type": "disabled"}})
    srv = Server(binary, ["--model", model, "--kv-cache", kv])
    try:
        first = ask(srv, msgs)
    finally:
        srv.close()
    check(any(f.endswith(".fbkv") for f in os.listdir(kv)), "kv cache: a checkpoint file after the first request")
    follow = msgs + [{"role": "assistant", "content": first.choices[0].message.content or "ok"},
                     {"role": "user", "content": "And the wind?"}]
    srv = Server(binary, ["--model", model, "--kv-cache", kv])  # a restart: nothing in memory
    try:
        again = ask(srv, msgs)
        cont = ask(srv, follow)
        check(metric(srv, "flashbox_kv_cache_restored_tokens_total") >= again.usage.prompt_tokens_details.cached_tokens > 0 and
              metric(srv, "flashbox_kv_cache_hits_total") >= 1, "kv cache: /metrics counts the restored tokens and hits")
    finally:
        srv.close()
    check(again.usage.prompt_tokens_details.cached_tokens > 0, f"kv cache: the same prompt after a restart restores "
          f"{again.usage.prompt_tokens_details.cached_tokens} of {again.usage.prompt_tokens} tokens")
    # the follow-up resends the answer: the first prompt at least is restored (past it when the
    # re-encoded answer matches the generated ids: the conversation checkpoint)
    check(cont.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
          f"kv cache: the next turn restores {cont.usage.prompt_tokens_details.cached_tokens} of {cont.usage.prompt_tokens} tokens "
          f"(the first prompt had {first.usage.prompt_tokens})")
    cold = Server(binary, ["--model", model])
    try:
        cold_again, cold_cont = ask(cold, msgs), ask(cold, follow)
    finally:
        cold.close()
    check(again.choices[0].message.content == cold_again.choices[0].message.content and
          cont.choices[0].message.content == cold_cont.choices[0].message.content,
          "kv cache: answers after a restore equal a cold server's (temperature 0)")


def served(binary, args, fn):
    """fn(server) on a server started with args, which is closed afterwards."""
    srv = Server(binary, args)
    try:
        return fn(srv)
    finally:
        srv.close()


def kv_cache_image_restart_tests(binary, model):
    """Issue 21 with an image: the same image prompt after a server restart restores from the disk
    KV cache (keyed by the image's content), another image at the same place does not restore the
    image span, and the answers equal a cold server's."""
    kv = tempfile.mkdtemp()
    png_a, png_b = make_png(40, 30, 3), make_png(40, 30, 4)
    def ask(srv, png):
        return srv.oa().chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Look at this:"}, {"type": "image_url", "image_url": {"url": data_url(png)}}]}],
            max_tokens=4, temperature=0, extra_body={"thinking": {"type": "disabled"}})
    first = served(binary, ["--model", model, "--kv-cache", kv], lambda srv: ask(srv, png_a))
    # a restart: nothing in memory
    again, other = served(binary, ["--model", model, "--kv-cache", kv], lambda srv: (ask(srv, png_a), ask(srv, png_b)))
    n = first.usage.prompt_tokens
    check(again.usage.prompt_tokens_details.cached_tokens >= n - 1,
          f"kv cache, image: the same image prompt after a restart restores {again.usage.prompt_tokens_details.cached_tokens} of {n} tokens")
    check(other.usage.prompt_tokens == n and other.usage.prompt_tokens_details.cached_tokens < n - 5,
          f"kv cache, image: another image at the same place restores only the text before it "
          f"({other.usage.prompt_tokens_details.cached_tokens} of {n})")
    cold_a, cold_b = served(binary, ["--model", model], lambda srv: (ask(srv, png_a), ask(srv, png_b)))
    check(again.choices[0].message.content == cold_a.choices[0].message.content and
          other.choices[0].message.content == cold_b.choices[0].message.content,
          "kv cache, image: answers after a restore equal a cold server's (temperature 0)")


def tiny_model_tests(binary, model):
    srv = Server(binary, ["--model", model])
    try:
        oa, an = srv.oa(), srv.an()
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0,
                                       extra_body={"thinking": {"type": "disabled"}})
        check(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("length", "stop"), "tiny: chat non-stream")
        n = sum(1 for ch in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True))
        check(n >= 2, "tiny: chat stream (thinking on)")
        rr = oa.responses.create(model="m", input="Hi", max_output_tokens=3)
        check(rr.usage.output_tokens >= 1, "tiny: responses")
        with an.messages.stream(model="m", max_tokens=3, messages=[{"role": "user", "content": "Hi"}]) as st:
            check(st.get_final_message().usage.output_tokens >= 1, "tiny: messages stream")
        c = oa.completions.create(model="m", prompt="The sky is", max_tokens=3, logprobs=2)
        check(len(c.choices[0].logprobs.tokens) >= 1, "tiny: completions with logprobs")
        # logit_bias and penalties through the SDK (issue 27): +100 on one id makes greedy emit it only.
        fb = oa.completions.create(model="m", prompt="The sky is", max_tokens=5, temperature=0, logprobs=1, logit_bias={"3000": 100})
        toks = fb.choices[0].logprobs.tokens
        check(len(toks) == 5 and len(set(toks)) == 1, f"tiny: logit_bias +100 forces one token ({toks})")
        fp = oa.completions.create(model="m", prompt="The sky is", max_tokens=6, temperature=0, frequency_penalty=2.0, presence_penalty=2.0)
        check(fp.usage.completion_tokens >= 1, "tiny: presence and frequency penalties accepted")
        try:
            oa.completions.create(model="m", prompt="x", max_tokens=2, logit_bias={"99999999": 1})
            check(False, "a logit_bias id outside the vocabulary must fail")
        except openai.BadRequestError as e:
            check("vocabulary" in str(e), "logit_bias outside the vocabulary -> 400")
        # A client that disconnects from a NON-streaming request cancels it.
        before = metric(srv, "flashbox_requests_cancelled_total")
        s = raw_post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell a long story"}],
                                                    "max_tokens": 8000, "temperature": 1.0, "seed": 1}, read=False)
        time.sleep(1.0)
        s.close()
        cancelled = False
        for _ in range(100):
            if metric(srv, "flashbox_requests_cancelled_total") > before:
                cancelled = True
                break
            time.sleep(0.1)
        check(cancelled, "tiny: client disconnect cancels a non-streaming request")
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=2)
        check(r.usage.completion_tokens >= 1, "tiny: serving after the cancelled request")
        check(metric(srv, "flashbox_prefill_tokens_total") > 0 and metric(srv, "flashbox_decode_tokens_total") > 0,
              "metrics: prefill/decode token counters")
    finally:
        srv.close()


def concurrency_tests(binary, model):
    """Issue 20: several sessions at once. 8 concurrent streaming requests through the openai SDK all
    complete and each equals its solo run (tokens and logprobs, temperature 0); a cancelled stream
    frees its session for a waiting request; a full queue answers 429 with Retry-After and the
    server recovers."""
    import threading
    users = ["Hello", "Tell me about the sea and the sky in a few words, please.", "What is two plus two?",
             "Write a short poem about a cat on a warm windowsill while the city hums below.", "Explain DSpark.",
             "Name three colours.", "Why is the sky blue? Give a careful answer with several steps.", "Count to twelve."]
    def stream(srv, i, out):
        parts, lps = [], []
        for ch in srv.oa().chat.completions.create(model="m", messages=[{"role": "user", "content": users[i]}], stream=True,
                                                   max_tokens=6 + 3 * (i % 4), temperature=0, logprobs=True, top_logprobs=2,
                                                   extra_body={"thinking": {"type": "disabled"}}):
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
            if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
                for t in ch.choices[0].logprobs.content:
                    lps.append((t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]))
            if ch.choices and ch.choices[0].finish_reason:
                parts.append("|" + ch.choices[0].finish_reason)
        out[i] = ("".join(parts), lps)
    solo = {}
    srv = Server(binary, ["--model", model, "--max-sessions", "1", "--prefill-chunk", "16"])
    try:
        for i in range(8):
            stream(srv, i, solo)
    finally:
        srv.close()
    both = {}
    # The default prefill policy (chunks beside decode rows sized from measured step times, so
    # their sizes depend on the clock): the answers must not.
    srv = Server(binary, ["--model", model, "--max-sessions", "8", "--prefill-chunk", "16"])
    try:
        ts = [threading.Thread(target=stream, args=(srv, i, both)) for i in range(8)]
        for t in ts: t.start()
        for t in ts: t.join(300)
        check(len(both) == 8, f"sessions: 8 concurrent SDK streams all complete ({len(both)})")
        for i in range(8):
            check(both[i] == solo[i] and len(solo[i][1]) >= 1, f"sessions: stream {i} equals its solo run ({len(solo[i][1])} tokens with logprobs)")
        steps, sess = metric(srv, "flashbox_steps_total"), metric(srv, "flashbox_step_sessions_total")
        check(sess / steps > 1.5, f"sessions: steps were shared ({sess / steps:.2f} sessions per step)")
        check(metric(srv, "flashbox_time_to_first_token_seconds_count") == 8 and metric(srv, "flashbox_max_sessions") == 8,
              "metrics: time to first token, max sessions")
        req = urllib.request.Request(srv.base + "/v1/stats", headers={"Authorization": "Bearer k"})
        st = json.loads(urllib.request.urlopen(req, timeout=10).read())
        steps, lat = st["steps"], st["latency"]
        check(steps["draft_blocks"] > steps["draft_calls"] > 0,
              f"sessions: DSpark drafts of several sessions share executor calls ({steps['draft_blocks']} blocks in {steps['draft_calls']} calls)")
        check(steps["reference_steps"] >= 1 and steps["mixed_prefill_rows"] >= 1,
              f"sessions: the prefill policy measured ({steps['reference_steps']} reference steps, last chunk {steps['mixed_prefill_rows']} rows)")
        check(lat["gap_count"] > 0 and lat["gap_buckets"][-1]["count"] == lat["gap_count"] and lat["gap_max_s"] > 0,
              f"stats: inter-token gaps ({lat['gap_count']}, max {lat['gap_max_s']:.3f} s)")
    finally:
        srv.close()
    # A cancelled stream frees its session: two long streams fill --max-sessions 2, a third request
    # waits until one of them is closed.
    srv = Server(binary, ["--model", model, "--max-sessions", "2"])
    try:
        oa = srv.oa()
        longs = [oa.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Tell a long story {k}"}], stream=True,
                                            max_tokens=8000, temperature=1.0, seed=k) for k in range(2)]
        its = [iter(x) for x in longs]
        for it in its:
            next(it); next(it)  # both are generating
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("r", oa.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)))
        t.start()
        time.sleep(1.0)
        check(metric(srv, "flashbox_queue_depth") == 1 and "r" not in done, "sessions: a third request waits while two sessions are busy")
        longs[0].close()
        t.join(120)
        check("r" in done and done["r"].usage.completion_tokens >= 1, "sessions: closing a stream frees its session for the waiting request")
        longs[1].close()
        ok = False
        for _ in range(100):
            if metric(srv, "flashbox_requests_active") == 0 and metric(srv, "flashbox_requests_cancelled_total") >= 2:
                ok = True; break
            time.sleep(0.1)
        check(ok, "sessions: both closed streams were cancelled, no session left active")
    finally:
        srv.close()
    # Oversubscribed: one session, one queue slot. A third request gets 429 with Retry-After; after
    # the long one is cancelled the server serves again.
    srv = Server(binary, ["--model", model, "--max-sessions", "1", "--max-queue", "1"])
    try:
        oa = srv.oa()
        long = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell a long story"}], stream=True,
                                          max_tokens=8000, temperature=1.0, seed=3)
        it = iter(long); next(it); next(it)
        queued = {}
        t = threading.Thread(target=lambda: queued.setdefault("r", oa.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)))
        t.start()
        for _ in range(100):
            if metric(srv, "flashbox_queue_depth") == 1: break
            time.sleep(0.05)
        raw = raw_post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        check(raw.startswith("HTTP/1.1 429") and "Retry-After: 1" in raw and "rate_limit_exceeded" in raw,
              "sessions: a full queue answers 429 with Retry-After")
        try:
            oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
            check(False, "a full queue must refuse")
        except openai.RateLimitError as e:
            check(e.status_code == 429, "sessions: the SDK sees RateLimitError (429)")
        long.close()
        t.join(120)
        check("r" in queued, "sessions: the queued request completes after the long one is cancelled")
        r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=2)
        check(r.usage.completion_tokens >= 1 and metric(srv, "flashbox_queue_rejected_total") == 2, "sessions: the server recovers after 429s")
    finally:
        srv.close()


def vision_tests(binary, model):
    srv = Server(binary, ["--model", model, "--prefill-chunk", "16", "--sse-keepalive-ms", "1"])
    try:
        oa, an = srv.oa(), srv.an()
        png_a, png_b = make_png(40, 30, 1), make_png(40, 30, 2)
        def ask(png, text="What is in this image?", **kw):
            return oa.chat.completions.create(model="m", messages=[{"role": "user", "content": [
                {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(png)}}]}],
                max_tokens=3, temperature=0, extra_body={"thinking": {"type": "disabled"}}, **kw)
        plain = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is in this image?"}], max_tokens=1,
                                           temperature=0, extra_body={"thinking": {"type": "disabled"}})
        r = ask(png_a)
        check(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("length", "stop"), "vision: OpenAI SDK chat with an image data URL")
        check(r.usage.prompt_tokens > plain.usage.prompt_tokens + 5, f"vision: the image span is in the prompt ({r.usage.prompt_tokens} vs {plain.usage.prompt_tokens} text-only)")
        r2 = ask(png_a)
        check(r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1, "vision: same image again reuses the whole prefix")
        r3 = ask(png_b)
        check(r3.usage.prompt_tokens == r.usage.prompt_tokens and r3.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens - 5,
              f"vision: a different image (same ids) does not reuse the image's KV (cached {r3.usage.prompt_tokens_details.cached_tokens})")
        n = sum(1 for _ in oa.chat.completions.create(model="m", stream=True, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(png_b)}}, {"type": "text", "text": "Describe"}]}]))
        check(n >= 2, "vision: streamed chat with an image")
        a = an.messages.create(model="m", max_tokens=3, thinking={"type": "disabled"}, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_a).decode()}},
            {"type": "text", "text": "What is in this image?"}]}])
        check(a.usage.input_tokens > plain.usage.prompt_tokens + 5 and a.usage.output_tokens >= 1, "vision: Anthropic image block")
        rr = oa.responses.create(model="m", max_output_tokens=3, reasoning={"effort": "none"}, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": data_url(png_a)}]}])
        check(rr.usage.input_tokens > plain.usage.prompt_tokens + 5, "vision: Responses input_image")
        for bad, what in [(b"definitely not an image", "garbage bytes"), (png_a[:len(png_a) // 2], "truncated PNG")]:
            try:
                ask(bad)
                check(False, "bad image must fail")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and "image 0" in str(e), f"vision: bad image ({what}) -> 400")
        try:
            an.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@@"}}]}])
            check(False, "bad anthropic image must fail")
        except anthropic.BadRequestError as e:
            check(e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", "vision: bad Anthropic image -> 400 invalid_request_error")
        for url, what in [("https://example.com/cat.png", "network URL"), ("file:///etc/hostname", "local file without --allow-local-images")]:
            try:
                oa.chat.completions.create(model="m", max_tokens=3, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
                check(False, what + " must fail")
            except openai.BadRequestError as e:
                check(e.status_code == 400, f"vision: {what} -> 400")
        # SSE keep-alives during the prefill (--sse-keepalive-ms 1, 16-row chunks).
        raw = raw_post(srv, "/v1/chat/completions", {"stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(make_png(60, 50, 3))}}]}]})
        check(": keep-alive" in raw and "data: [DONE]" in raw, "vision: SSE keep-alive comments while prefilling")
        raw = raw_post(srv, "/v1/messages", {"stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(make_png(60, 50, 4)).decode()}}]}]})
        check("event: ping" in raw and "event: message_stop" in raw, "vision: Anthropic ping events while prefilling")
        check(metric(srv, "flashbox_images_total") >= 6, "metrics: images counted")
    finally:
        srv.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=os.environ.get("FB_TINY_MODEL", ""))
    a = ap.parse_args()
    scripted_tests(a.bin)
    model = tiny_model(a.bin, a.model)
    tiny_model_tests(a.bin, model)
    concurrency_tests(a.bin, model)
    kv_cache_restart_tests(a.bin, model)
    vmodel = tiny_model(a.bin, "", "--vision")
    vision_tests(a.bin, vmodel)
    kv_cache_image_restart_tests(a.bin, vmodel)
    print("PASS")


if __name__ == "__main__":
    main()
