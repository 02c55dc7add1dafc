#!/usr/bin/env python3
"""Writes the Pillow-parity cases of vision_test: synthetic images plus, per vision config, the
reference preprocessing's plan and an FNV-1a 64 hash of its BF16 patch bytes (the patches
themselves would be megabytes). Needs Pillow, numpy, torch and the reconstructed reference package
(ds41ref) importable from DS41_REFERENCE (default: <repo>/.oracle). Run from anywhere:
    python3 src/vision/testdata/make_pillow_cases.py
"""
import io, json, os, sys
from types import SimpleNamespace
import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../.."))
sys.path.insert(0, os.environ.get("DS41_REFERENCE", os.path.join(REPO, ".oracle")))
from ds41ref.image_processor import load_image  # noqa: E402

CONFIGS = {
    "release": dict(vision_patch_size=14, vision_downsample_ratio=3, vision_max_n_token=1024, vision_min_pixels=544 * 544, vision_max_wh_ratio=None),
    "small": dict(vision_patch_size=14, vision_downsample_ratio=3, vision_max_n_token=64, vision_min_pixels=84 * 84, vision_max_wh_ratio=None),
    "squeeze": dict(vision_patch_size=14, vision_downsample_ratio=3, vision_max_n_token=64, vision_min_pixels=84 * 84, vision_max_wh_ratio=2),
}


def pattern(w, h, seed, channels=3, noise=40):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = [(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)), ((x * 7 + y * 13) ^ (x >> 2)) & 255]
    a = np.stack(base[:3], -1).astype(np.int32)
    a += rng.integers(-noise, noise + 1, size=a.shape)  # texture so resampling has edges to get wrong
    if channels == 4:
        a = np.concatenate([a, ((x + y) % 256)[..., None]], -1)
    return np.clip(a, 0, 255).astype(np.uint8)


def encode(arr, fmt, mode=None, **kw):
    im = Image.fromarray(arr)
    if mode:
        im = im.convert(mode)
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def fnv64(b):
    h = 0xCBF29CE484222325
    for byte in b:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


CASES = [
    ("s67x13.png", lambda: encode(pattern(67, 13, 1), "PNG")),
    ("s13x67.png", lambda: encode(pattern(13, 67, 2), "PNG")),
    ("s19x25_rgba.png", lambda: encode(pattern(19, 25, 3, 4), "PNG")),
    ("s73x91.png", lambda: encode(pattern(73, 91, 4), "PNG")),
    ("s1x1.png", lambda: encode(pattern(1, 1, 5), "PNG")),
    ("s300x200.png", lambda: encode(pattern(300, 200, 6, noise=3), "PNG")),
    ("s500x60.png", lambda: encode(pattern(500, 60, 7, noise=3), "PNG")),
    ("s45x700.png", lambda: encode(pattern(45, 700, 8, noise=3), "PNG")),
    ("s1900x1100.jpg", lambda: encode(pattern(1900, 1100, 9, noise=0), "JPEG", quality=50)),
    ("s97x61_q85.jpg", lambda: encode(pattern(97, 61, 10), "JPEG", quality=85)),
    ("s50x40_pal.png", lambda: encode(pattern(50, 40, 11), "PNG", mode="P")),
    ("s50x40_grey.png", lambda: encode(pattern(50, 40, 12), "PNG", mode="L")),
    ("s64x48.webp", lambda: encode(pattern(64, 48, 13), "WEBP", lossless=True)),
]


def main():
    cases = []
    for name, make in CASES:
        data = make()
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
        for cname, cfg in CONFIGS.items():
            args = SimpleNamespace(**cfg)
            patches, nvh, nvw, nlh, nlw = load_image({"data": data}, args)
            raw = patches.contiguous().view(-1).view(dtype=__import__("torch").int16).numpy().astype("<i2").tobytes()
            cases.append(dict(file=name, config=cname, nvh=nvh, nvw=nvw, nlh=nlh, nlw=nlw, fnv64=f"{fnv64(raw):016x}"))
    with open(os.path.join(HERE, "pillow_cases.json"), "w") as f:
        json.dump(dict(pillow=__import__("PIL").__version__, configs=CONFIGS, cases=cases), f, indent=1)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
