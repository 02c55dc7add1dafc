#!/usr/bin/env python3
"""Prints the C++ table of code points HF's regex engine (Oniguruma in `tokenizers`) knows but
ICU (libicu-dev, 72 = Unicode 15.0 on Debian 12) does not, with their General_Category, for
src/tokenizer/pre_tokenizer.cpp (kSupplement). HF's membership is read from its own engine:
a Split pre-tokenizer `\\p{Xx}!|!` over "c!" for each candidate code point c. Also checks that
HF's `\\s` is [\\t-\\r\\x85\\p{Z}] (PCRE2's \\s adds U+180E).

usage: gen_unicode_supplement.py   (needs `tokenizers`, g++ and libicu-dev)
"""
import os
import subprocess
import sys
import tempfile

from tokenizers import Regex, pre_tokenizers

GCS = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi",
       "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co"]
ICU_DUMP = r"""
#include <unicode/uchar.h>
#include <cstdio>
int main() { for (UChar32 c = 0; c <= 0x10FFFF; ++c) std::printf("%d\n", int(u_charType(c))); }
"""


def icu_assigned():
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "dump.cpp"), os.path.join(d, "dump")
        with open(src, "w") as f:
            f.write(ICU_DUMP)
        flags = subprocess.check_output(["pkg-config", "--cflags", "--libs", "icu-uc"], text=True).split()
        subprocess.check_call(["g++", "-O1", src, "-o", exe] + flags)
        types = subprocess.check_output([exe], text=True).split()
    return [int(t) for t in types]  # UCharCategory; 0 = U_UNASSIGNED


# UCharCategory values (uchar.h) -> General_Category short names.
ICU_GC = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Me", "Mc", "Nd", "Nl", "No", "Zs", "Zl", "Zp", "Cc",
          "Cf", "Co", "Cs", "Pd", "Ps", "Pe", "Pc", "Po", "Sm", "Sc", "Sk", "So", "Pi", "Pf"]


def members(pattern, cps):
    """The code points of `cps` that HF's engine matches with `pattern` (one code point)."""
    sp = pre_tokenizers.Split(Regex(pattern + "!|!"), behavior="isolated")
    text = "".join(chr(c) + "!" for c in cps)
    return {ord(p[0]) for p, _ in sp.pre_tokenize_str(text) if len(p) == 2 and p != "!!"}


def main():
    types = icu_assigned()
    cps = [c for c in range(0x110000) if types[c] == 0 and not 0xD800 <= c <= 0xDFFF and c != ord("!")]
    # Code points ICU knows: HF's major category must be ICU's (no category change since).
    known = [c for c in range(0x110000) if types[c] not in (0, 18) and c != ord("!")]
    for major in "LMNPSZC":
        hf = members(r"\p{" + major + "}", known)
        icu = {c for c in known if ICU_GC[types[c]][0] == major}
        if hf != icu:
            print(f"// WARNING: \\p{{{major}}} differs from ICU at {[hex(c) for c in sorted(hf ^ icu)[:20]]}",
                  file=sys.stderr)
    rows = []
    for gc in GCS:
        rows += [(c, gc) for c in members(r"\p{" + gc + "}", cps)]
    rows.sort()
    assert len({c for c, _ in rows}) == len(rows), "a code point in two categories"
    ranges = []
    for c, gc in rows:
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == gc:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, gc])
    # \s: HF's engine vs [\t-\r\x85\p{Z}] over every code point.
    allc = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != ord("!")]
    ws = members(r"\s", allc)
    z = members(r"\p{Z}", allc)
    want = set(range(9, 14)) | {0x85} | z
    if ws != want:
        print(f"// WARNING: HF \\s differs from [\\t-\\r\\x85\\p{{Z}}] at {sorted(ws ^ want)[:20]}", file=sys.stderr)
    print(f"// {len(rows)} code points in {len(ranges)} ranges (gen_unicode_supplement.py).")
    for a, b, gc in ranges:
        print(f'    {{0x{a:X}, 0x{b:X}, "{gc}"}},')


if __name__ == "__main__":
    main()
