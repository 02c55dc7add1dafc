#!/usr/bin/env bash
# Compare the SASS of CUDA files at a git revision (default HEAD) with the working tree: a
# refactor that leaves every kernel's machine code unchanged cannot change a bit of its output.
# Used when no GPU is at hand. Usage: tools/sass_diff.sh [--rev REV] src/cuda/a.cu [src/cuda/b.cu ...]
# Exit 0: identical SASS for every file; 1: differences (a short diff is printed); 2: a build failed.
set -euo pipefail
rev=HEAD
if [[ "${1:-}" == "--rev" ]]; then rev=$2; shift 2; fi
root=$(git rev-parse --show-toplevel)
# cuobjdump is not in the toolkit here: `build/pyenv/bin/pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (PyPI).
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || ls "$root"/build/pyenv/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump 2>/dev/null | head -1 || true)}
if [[ -n "$cuobjdump" ]]; then export PATH="$(dirname "$cuobjdump"):$PATH"; fi  # nvdisasm beside it (pip install nvidia-cuda-nvdisasm)
if [[ -z "$cuobjdump" ]]; then
  echo "no cuobjdump: build/pyenv/bin/pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or set CUOBJDUMP)"; exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$rev" src | tar -x -C "$work"
flags=(-O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --fmad=false -Xcompiler=-ffp-contract=off -diag-suppress=2810
       -std=c++20 -x cu -cubin)
status=0
for f in "$@"; do
  name=$(basename "$f" .cu)
  for side in old new; do
    if [[ $side == old ]]; then base=$work; else base=$root; fi
    if ! nvcc "${flags[@]}" -I"$base/src" -isystem=/usr/local/cuda/include "$base/$f" -o "$work/$name.$side.cubin" 2> "$work/$name.$side.log"; then
      echo "$f: $side build failed"; tail -5 "$work/$name.$side.log"; exit 2
    fi
    # Without the addresses, the encodings and the per-path hash of anonymous namespaces: what is
    # left differs only where the machine code does.
    "$cuobjdump" -sass "$work/$name.$side.cubin" | sed -E 's@/\*[0-9a-f]{4,}\*/@@; s@ +/\* 0x[0-9a-f]+ \*/@@; s@_GLOBAL__N__[0-9a-f]+_@_GLOBAL__N__@g' > "$work/$name.$side.sass"
  done
  if cmp -s "$work/$name.old.sass" "$work/$name.new.sass"; then
    echo "$f: SASS identical ($(grep -c 'Function :' "$work/$name.new.sass") functions)"
  elif cmp -s <(python3 "$root/tools/sass_split.py" "$work/$name.old.sass") <(python3 "$root/tools/sass_split.py" "$work/$name.new.sass"); then
    echo "$f: SASS identical function by function ($(grep -c 'Function :' "$work/$name.new.sass") functions, in another order)"
  else
    status=1
    echo "$f: SASS differs"
    diff "$work/$name.old.sass" "$work/$name.new.sass" > "$work/$name.diff" || true
    echo "  $(grep -c "^[<>]" "$work/$name.diff") lines differ; the first:"; head -20 "$work/$name.diff"
    # The same instructions in another order or other registers (scheduling, allocation)?
    norm() { grep -E '^\s+(@!?U?P[0-9T] )?[A-Z]' "$1" | sed -E 's/\b(U?R|U?P|B)[0-9]+\b/\1/g; s/0x[0-9a-f]+/N/g; s/\.reuse//g' | sort; }
    if cmp -s <(norm "$work/$name.old.sass") <(norm "$work/$name.new.sass"); then
      echo "  the same multiset of instructions up to registers, addresses and order"
    else
      echo "  instructions differ: $(diff <(norm "$work/$name.old.sass") <(norm "$work/$name.new.sass") | grep -c '^[<>]') after normalising"
      fp() { norm "$1" | grep -E '^\s*(@!?P )?(H?F(FMA|MUL|ADD|MNMX|SETP|SEL)|HMMA|QGMMA|HGMMA|MUFU|F2F|F2FP|I2F|F2I)' || true; }
      if cmp -s <(fp "$work/$name.old.sass") <(fp "$work/$name.new.sass"); then
        echo "  floating-point and tensor-core instructions: the same multiset"
      else
        echo "  floating-point and tensor-core instructions differ: $(diff <(fp "$work/$name.old.sass") <(fp "$work/$name.new.sass") | grep -c '^[<>]')"
      fi
    fi
    if [[ -n "${SASS_DIFF_KEEP:-}" ]]; then cp "$work/$name.diff" "$work/$name.old.sass" "$work/$name.new.sass" "$SASS_DIFF_KEEP"/; fi
  fi
done
exit $status
