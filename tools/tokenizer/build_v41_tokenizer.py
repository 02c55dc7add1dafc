#!/usr/bin/env python3
"""Builds a DeepSeek-V4.1-equivalent tokenizer.json (spec/15 §3) from the DeepSeek-V3 file.

Keeps model, normalizer, pre_tokenizer, decoder and post_processor; replaces added_tokens with
V4.1's 1,283 rows (spec/15 §2). Flags the spec leaves UNVERIFIED are chosen here: placeholder
tokens (place_holder*, mm_span, rl_image_*) and the BOS/EOS/pad/EOT controls are `special`,
everything else is not. All rows: normalized false, no strip, not single-word.

usage: build_v41_tokenizer.py SRC_TOKENIZER_JSON OUT_TOKENIZER_JSON
"""
import json
import sys

BAR = "\uff5c"   # ｜ FULLWIDTH VERTICAL LINE
SP = "\u2581"    # ▁ LOWER ONE EIGHTH BLOCK


def fw(name):
    return "<" + BAR + name.replace(" ", SP) + BAR + ">"


def v41_rows():
    rows = [(0, fw("begin of sentence"), True), (1, fw("end of sentence"), True),
            (2, "<" + BAR + SP + "pad" + SP + BAR + ">", True)]
    for n in range(799):
        rows.append((128000 + n, fw(f"place holder no {n}"), True))
    named = [
        (128799, fw("System"), False), (128800, fw("fim hole"), False),
        (128801, fw("fim begin"), False), (128802, fw("fim end"), False),
        (128803, fw("User"), False), (128804, fw("Assistant"), False),
        (128805, "<|EOT|>", True),
        (128806, fw("tool calls begin"), False), (128807, fw("tool calls end"), False),
        (128808, fw("tool call begin"), False), (128809, fw("tool call end"), False),
        (128810, fw("tool outputs begin"), False), (128811, fw("tool outputs end"), False),
        (128812, fw("tool output begin"), False), (128813, fw("tool output end"), False),
        (128814, fw("tool sep"), False),
        (128815, fw("begin of repo name"), False), (128816, fw("end of repo name"), False),
        (128817, fw("begin of file name"), False), (128818, fw("end of file name"), False),
        (128819, fw("begin of file"), False), (128820, fw("end of file"), False),
        (128821, "<think>", False), (128822, "</think>", False),
        (128823, fw("place holder for copy"), True),
        (128824, fw("place holder for pointer replace"), True),
        (128825, BAR + "DSML" + BAR, False),
        (128826, fw("begin sys"), False), (128827, fw("end sys"), False),
        (128828, fw("latest_reminder"), False), (128829, fw("action"), False),
        (128830, fw("query"), False), (128831, fw("authority"), False),
        (128832, fw("domain"), False), (128833, fw("task"), False),
        (128834, fw("political"), False), (128835, fw("entity"), False),
        (128836, fw("title"), False), (128837, fw("safety"), False),
        (128838, fw("answer"), False), (128839, fw("search"), False),
        (128840, "<dsml:", False), (128841, "</dsml:", False),
        (128842, fw("search begin"), False), (128843, fw("search end"), False),
        (128844, fw("extracted_url"), False), (128845, fw("read_url"), False),
        (128846, fw("end_of_query"), False),
    ]
    rows += named
    for k in range(415):  # 128847..129261 -> mm span 0021..0435
        rows.append((128847 + k, f"<|place_holder_mm_span_{21 + k:04d}|>", True))
    rows += [(129262, fw("rl_image_pad"), True), (129263, fw("rl_image_start"), True),
             (129264, fw("deepseek_image"), False)]
    for k in range(6):  # 129265..129270 -> 0436..0441
        rows.append((129265 + k, f"<|place_holder_mm_span_{436 + k:04d}|>", True))
    for i, name in enumerate(["/polygon", "polygon", "/point", "point", "/box", "box", "/ref", "ref"]):
        rows.append((129271 + i, fw(name), False))
    rows.append((129279, "<|place_holder_mm_span_0442|>", True))
    return rows


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    rows = v41_rows()
    ids = [r[0] for r in rows]
    assert len(rows) == 1283, len(rows)
    assert ids == sorted(set(ids)) and ids[3:] == list(range(128000, 129280)), "id table broken"
    assert len({r[1] for r in rows}) == 1283, "duplicate content"
    tok["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": s} for i, c, s in rows]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {out}: {len(rows)} added tokens")


if __name__ == "__main__":
    main()
