#!/usr/bin/env python3
"""Derives the Engram compressed token map (spec/15 §5, spec/11 §6.1) with HF `tokenizers`.

Writes int32[vocab] little-endian to OUT (optional) and prints the class count and sha256.
This is the offline reference the C++ derivation (src/tokenizer/engram_map.cpp) is checked
against; it needs `pip install tokenizers`.

usage: engram_map.py TOKENIZER_JSON [OUT_BIN]
"""
import hashlib
import struct
import sys

from tokenizers import Regex, Tokenizer, normalizers


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), "\ue000"),
        normalizers.Strip(),
        normalizers.Replace("\ue000", " "),
    ])
    n = tok.get_vocab_size(with_added_tokens=True)
    classes = {}
    out = []
    for i in range(n):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        out.append(classes.setdefault(key, len(classes)))
    blob = struct.pack(f"<{n}i", *out)
    print(f"ids {n} classes {len(classes)} sha256 {hashlib.sha256(blob).hexdigest()}")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
