#!/usr/bin/env bash
# Runs the test suite: builds (installing dependencies when missing), then every ctest labelled
# `fast` (unit, op-vector, fixture, tokenizer and server tests). GPU tests (label `gpu`) run on the
# device with tools/device_run.sh. Python test tools (HF tokenizers, openai, anthropic) come from PyPI.
# Usage: tools/test.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
tools/setup.sh "$preset"
if ! python3 -c "import tokenizers, openai, anthropic, requests" >/dev/null 2>&1; then
  python3 -m pip install -q tokenizers openai anthropic requests numpy || echo "test: pip install failed; python-based tests will skip"
fi
ctest --test-dir "build/$preset" -L fast --output-on-failure -j "$(nproc)"
# Bounded libFuzzer runs of the untrusted-input parsers (safetensors header, config, DSML, BPE).
tools/fuzz.sh 15
