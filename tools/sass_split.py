#!/usr/bin/env python3
"""Split a cuobjdump -sass listing (addresses stripped) into functions and print them sorted by
name, so that two builds whose functions only come in another order compare equal
(tools/sass_diff.sh)."""
import sys

funcs = {}
name = None
for line in open(sys.argv[1]):
    if "Function :" in line:
        name = line.split("Function :", 1)[1].strip()
        funcs[name] = []
    elif name is not None:
        funcs[name].append(line)
try:
    for n in sorted(funcs):
        sys.stdout.write(f"Function : {n}\n")
        sys.stdout.writelines(funcs[n])
except BrokenPipeError:  # cmp stops reading at the first difference
    sys.stderr.close()
