"""Shared by the server tests (tests/server/test_*.py): a free port, a `flashbox serve` process
that is up when the constructor returns, SDK clients for it, the tiny model to serve, and the
checks' tally."""
import argparse, os, socket, subprocess, sys, tempfile, time, urllib.request


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


class Server:
    """`flashbox serve --port P --api-key k ARGS`, waited for on /health (60 s at most)."""

    def __init__(self, binary, args):
        self.port = free_port()
        self.proc = subprocess.Popen([binary, "serve", "--port", str(self.port), "--api-key", "k"] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.proc.stdout.read())
            try:
                urllib.request.urlopen(self.base + "/health", timeout=1); return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def close(self):
        self.proc.terminate(); self.proc.wait(10)

    def oa(self, timeout=120):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key="k", max_retries=0, timeout=timeout)

    def an(self, timeout=120):
        import anthropic
        return anthropic.Anthropic(base_url=self.base, api_key="k", max_retries=0, timeout=timeout)


def tiny_model(binary, given="", *extra):
    """`given` when set, else a fresh `make-tiny EXTRA` folder (the test fails when it cannot be made)."""
    if given:
        return given
    model = os.path.join(tempfile.mkdtemp(), "tiny-vision" if "--vision" in extra else "tiny-model")
    if subprocess.run([binary, "make-tiny", *extra, "--out", model], capture_output=True).returncode != 0:
        print("FAIL: make-tiny " + " ".join(extra) + " failed"); sys.exit(1)
    return model


class Checks:
    """check(cond, msg) prints every check; finish() exits 1 naming the count when any failed."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            self.failures.append(msg)

    def finish(self):
        if self.failures:
            print(f"FAIL: {len(self.failures)} checks failed")
            sys.exit(1)
        print("PASS")


def bin_and_model():
    """The scripts' command line, --bin FLASHBOX [--model DIR] (default $FB_TINY_MODEL, else the
    tiny model made once by tiny_model): (binary, model directory)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=os.environ.get("FB_TINY_MODEL", ""))
    a = ap.parse_args()
    return a.bin, tiny_model(a.bin, a.model)
