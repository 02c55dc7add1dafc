#!/usr/bin/env python3
"""Generates a varied tokenizer corpus (one JSON string per line).

Fragments: code, prose in many scripts, CJK, emoji with joiners and modifiers, RTL text, combining
marks, every kind of whitespace and line ending, digit runs, long repeats, added-token strings and
near-misses, random code points from many Unicode blocks. All text here is written by us.

usage: make_corpus.py SEED N_DOCS > corpus.jsonl
"""
import json
import random
import sys

PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
    "Le cœur a ses raisons que la raison ne connaît point; voilà, déjà vu à l'école.",
    "Größere Straßenbahnen fahren über die Brücke — schön, oder?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "مرحبا بالعالم! هذه جملة عربية مع أرقام ١٢٣٤٥ و 67890.",
    "שלום עולם, זה משפט בעברית עם ניקוד: בְּרֵאשִׁית.",
    "नमस्ते दुनिया, यह एक हिंदी वाक्य है। संख्या: १२३४",
    "আমি বাংলায় গান গাই। তামিল: வணக்கம் உலகம்",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "안녕하세요 세계! 한국어 문장입니다. 가나다라마바사",
    "日本語の文章です。カタカナとひらがな、漢字が混ざっています。ｶﾀｶﾅ半角も。",
    "中文句子，包含标点符号：“引号”、（括号）和数字１２３。繁體字：電腦網路。",
    "Tiếng Việt có nhiều dấu: Ngày xưa, ở một ngôi làng nhỏ.",
    "Türkçe: Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul ıı",
    "ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ, ᠮᠣᠩᠭᠣᠯ",
    "Math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ = ∫₀¹ f(x) dx ≈ 3.14159… ≠ ∞ ℌ𝔢𝔩𝔩𝔬 𝟙𝟚𝟛",
    "Emoji: 👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 🇫🇷🇯🇵 ❤️‍🔥 🧑🏿‍🤝‍🧑🏻 1️⃣ #️⃣ 🫠🫶",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe \u2060 soft\u00adhyphen",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353\u0354 \u0e01\u0e34\u0e4d ﷺ ﷽",
    "Fullwidth: ＡＢＣ１２３！？ ｜pipe｜ ▁lower▁ ㈱ ㍿ ﬁ ﬀ Ⅻ ½ ⅞",
    "Mixed RTL: English then עברית then العربية then 123 back.",
]
CODE = [
    "def foo(x: int) -> int:\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}\n",
    "const f = async (a, b) => { await fetch(`/api/${a}?q=${b}`); };\r\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%bob%';",
    "<div class=\"x\">&nbsp;&lt;tag&gt;</div>\n<!-- comment -->",
    "fn main() { let v: Vec<u8> = vec![0x1f, 0xff]; println!(\"{:?}\", v); }",
    "    if err != nil {\n        return fmt.Errorf(\"wrap: %w\", err)\n    }\n",
    "$ ls -la | grep -E '^d' && echo \"done\" >> /tmp/log.txt 2>&1",
    "{\"key\": [1, 2.5e-3, true, null], \"nested\": {\"a\": \"b\"}}",
    "x_1=foo.bar_baz(__init__, self._private, obj.method().attr)",
    "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=2;l>>=3;m&&n||o;p?q:r;",
]
SPECIAL = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜System｜>", "<think>", "</think>", "｜DSML｜", "<|EOT|>", "<dsml:", "</dsml:",
    "<｜deepseek_image｜>", "<|place_holder_mm_span_0021|>", "<｜place▁holder▁no▁5｜>",
    "<｜User", "｜DSML", "<thin", "</think", "<|EOT|", "<｜▁pad▁｜>", "<｜tool▁sep｜>",
]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2028",
              "\u2029", "\u0085", "\u000b", "\u000c", "\u2009", "\u202f", "\u1680", " \t \n  "]
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
          (0x590, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f),
          (0x2100, 0x22ff), (0x2500, 0x25ff), (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
          (0xf900, 0xfaff), (0xfe00, 0xfe0f), (0xff00, 0xffef), (0x1d400, 0x1d7ff),
          (0x1f300, 0x1faff), (0x20000, 0x2a6df), (0xe000, 0xe0ff), (0x0, 0x1f), (0x80, 0x9f),
          # blocks with Unicode 15.0 / 15.1 / 16.0 additions (PCRE2 10.42's tables are 14.0)
          (0x11f00, 0x11f5f), (0x1e4d0, 0x1e4ff), (0x31350, 0x323af), (0x2ebf0, 0x2ee5d),
          (0x1cc00, 0x1ccff), (0x10d40, 0x10d8f), (0x1800, 0x18af)]
# Code points first assigned in Unicode 15.0 (ICU 72 knows them), 15.1 and 16.0 (HF's
# Oniguruma does, ICU 72 does not: pre_tokenizer.cpp's table), of every category, and U+180E
# (whitespace for PCRE2, not for HF).
NEW_CPS = ("\U0001FAF8\U0001FA77\U0001F6DC\U00031350\U000323AF\U00011F00\U00011F04\U00011F43"
           "\U00011F50\U0001E4D0\U0001E4EC\U0001E4F0\U0001D2C0\U00011B00\U0001DF25\U0001E030"
           "\U00010EFD\u0CF3\u0ECE\U0002EBF0\U0002EE5D\u2FFC\u31EF\U0001CCF0\U0001CC00"
           "\U00010D4A\U00010D40\U00016D40\U0001E5D0\U00011380\u0897\u1B4E\U0001FA89\u180E")


def random_chars(rng, n):
    # Any code point of the range, assigned or not (HF and we agree on every one: Unicode 16.0).
    lo, hi = rng.choice(RANGES)
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def new_code_points(rng):
    # Each newer code point between letters, digits, spaces and punctuation.
    glue = ["", " ", "a", "1", "!", "\n", "中", "\u0301"]
    return "".join(rng.choice(glue) + rng.choice(NEW_CPS) for _ in range(rng.randint(1, 12))) + rng.choice(glue)


def fragment(rng):
    k = rng.random()
    if k < 0.25:
        return rng.choice(PROSE)
    if k < 0.45:
        return rng.choice(CODE)
    if k < 0.55:
        return rng.choice(SPECIAL)
    if k < 0.65:
        return rng.choice(WHITESPACE) * rng.randint(1, 6)
    if k < 0.72:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    if k < 0.78:  # long repeats
        unit = rng.choice(["a", "ab", " ", "=", "-", "中", "😀", "\n", "0", "Ġ", "la "])
        return unit * rng.randint(50, 3000)
    if k < 0.85:  # a prose sentence with words shuffled
        words = rng.choice(PROSE).split(" ")
        rng.shuffle(words)
        return " ".join(words)
    if k < 0.93:
        return random_chars(rng, rng.randint(1, 30))
    return new_code_points(rng)


def document(rng):
    parts = [fragment(rng) for _ in range(rng.randint(1, 16))]
    seps = ["", " ", "\n", "\r\n", "\t", ""]
    return "".join(p + rng.choice(seps) for p in parts)


def main():
    seed, n = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    docs = [p for p in PROSE] + [c for c in CODE] + ["".join(SPECIAL), "", " ", "\n"]
    while len(docs) < n:
        docs.append(document(rng))
    for d in docs:
        print(json.dumps(d, ensure_ascii=False))


if __name__ == "__main__":
    main()
