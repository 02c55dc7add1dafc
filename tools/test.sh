#!/usr/bin/env bash
# Runs the test suite: builds (installing dependencies when missing), then every ctest labelled
# `fast` (unit, op-vector, fixture, tokenizer and server tests). GPU tests (label `gpu`) run on the
# device with tools/device_run.sh. Python test tools (HF tokenizers, openai, anthropic) come from PyPI
# into build/pyenv.
# Usage: tools/test.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
tools/setup.sh "$preset"
# Python test tools (HF tokenizers, openai, anthropic, matplotlib) in a virtual environment: Debian's system
# interpreter refuses a system-wide pip install (externally managed). ctest runs the Python tests
# with this interpreter, and they fail, not skip, without their packages.
VENV="$PWD/build/pyenv"
if [ ! -x "$VENV/bin/python3" ]; then
  python3 -m venv "$VENV" || { echo "test: python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
# matplotlib: tools/plot_bench.py (docs/plots/) and its test.
if ! "$VENV/bin/python3" -c "import tokenizers, openai, anthropic, requests, numpy, matplotlib" >/dev/null 2>&1; then
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check tokenizers openai anthropic requests numpy matplotlib ||
    { echo "test: pip install into $VENV failed (PyPI unreachable?)"; exit 1; }
fi
cmake -S . -B "build/$preset" -DPython3_EXECUTABLE="$VENV/bin/python3" >/dev/null
ctest --test-dir "build/$preset" -L fast --output-on-failure -j "$(nproc)"
# Bounded libFuzzer runs of the untrusted-input parsers (safetensors header, config, DSML, BPE).
tools/fuzz.sh 15
