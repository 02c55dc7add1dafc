#!/usr/bin/env bash
# Installs the build dependencies (Debian 12 packages only) and builds flashbox.
# Usage: tools/setup.sh [preset]   (default preset: "default" = CUDA when nvcc is found)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
pkgs=(build-essential cmake ninja-build pkg-config git python3 python3-numpy python3-venv
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libpcre2-dev libicu-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev
      libzstd-dev libpng-dev libjpeg-dev libwebp-dev clang libclang-rt-14-dev
      libjs-chart.js chromium)
# libjs-chart.js: the dashboard's charts, embedded at build time (without it the page draws its own).
# chromium: test only, headless, renders the dashboard (tests/server/test_dashboard.py; about a
# minute to install; the test skips its browser part without it).
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
# xgrammar's C++ core (constrained decoding, issue 27): Debian has no package, so its PyPI source
# distribution, pinned by version and hash, is unpacked into third_party/ (ignored by git) and the
# top-level CMakeLists builds its C++ sources. Without it the build has no response_format
# enforcement (those requests get 400); nothing else needs it.
xg_version=0.2.9
xg_sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
if [ ! -f "third_party/xgrammar-$xg_version/include/xgrammar/xgrammar.h" ]; then
  mkdir -p third_party
  tarball="third_party/xgrammar-$xg_version.tar.gz"
  if python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary xgrammar "xgrammar==$xg_version" -d third_party &&
     echo "$xg_sha256  $tarball" | sha256sum -c --quiet -; then
    tar xzf "$tarball" -C third_party && rm -f "$tarball"
    echo "setup: xgrammar $xg_version unpacked into third_party/"
  else
    rm -f "$tarball"
    echo "setup: could not fetch xgrammar $xg_version from PyPI: building without response_format enforcement"
  fi
fi
cmake --preset "$preset" >/dev/null
# Say which build this is and why (the CUDA executor needs nvcc; the GPU itself is not needed to build).
cuda_cc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "build/$preset/CMakeCache.txt" | head -1)
if [ -n "$cuda_cc" ] && [ "$cuda_cc" != "CMAKE_CUDA_COMPILER-NOTFOUND" ]; then
  echo "setup: preset $preset: CPU reference + CUDA executor (sm_90a; nvcc at $cuda_cc)"
else
  echo "setup: preset $preset: CPU reference only (no CUDA compiler found, or the preset turns CUDA off)"
fi
cmake --build --preset "$preset" -j "$(nproc)"
ln -sfn "build/$preset/flashbox" flashbox 2>/dev/null || true
echo "setup: built build/$preset/flashbox"
