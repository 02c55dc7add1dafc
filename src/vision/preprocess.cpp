#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/dtype.h"

namespace fb::vision {

namespace {

// Python's ceil/floor return ints; here they stay doubles until the final cast.
int64_t py_ceil(double x) { return int64_t(std::ceil(x)); }
int64_t py_floor(double x) { return int64_t(std::floor(x)); }
// Python round(): half to even on the double value.
int64_t py_round(double x) { return int64_t(std::nearbyint(x)); }

int64_t tokens_for(int64_t nlh, int64_t nlw) { return nlh * (nlw + 1) + 2; }

}  // namespace

Result<ImagePlan> plan_image(int width, int height, const model::VisionConfig& vc) {
  if (width <= 0 || height <= 0) return FB_ERROR(kInvalidArgument) << "image has no pixels (" << width << "x" << height << ")";
  const int64_t p = vc.patch_size, ds = vc.downsample, max_tok = vc.max_image_tokens;
  // w and h are Python numbers: ints, or a float after the optional squeeze.
  double w = width, h = height;
  if (vc.max_wh_ratio && w > h * *vc.max_wh_ratio) w = h * *vc.max_wh_ratio;
  if (w * h > 0 && w * h < double(vc.min_pixels)) {
    const double s = std::pow(double(vc.min_pixels) / (w * h), 0.5);  // x ** 0.5 is C pow
    w = std::trunc(w * s);
    h = std::trunc(h * s);
  }
  int64_t bw = py_ceil(w / double(p)) * p, bh = py_ceil(h / double(p)) * p;
  auto grid = [&](int64_t bh_, int64_t bw_, int64_t* nlh, int64_t* nlw) {
    *nlh = py_ceil(double(bh_ / p) / double(ds));
    *nlw = py_ceil(double(bw_ / p) / double(ds));
  };
  int64_t nlh, nlw;
  grid(bh, bw, &nlh, &nlw);
  if (tokens_for(nlh, nlw) > max_tok) {  // solve_resize_ratio
    const double r = h / w;
    const double mw = std::sqrt(double(max_tok - 2) / r + 0.25) - 0.5;
    const double mh = mw * r;
    const int64_t cell = p * ds;
    if (mw < 1.0) {
      bh = (max_tok - 2) / 2 * cell;
      bw = cell;
    } else if (mh < 1.0) {
      bh = cell;
      bw = (max_tok - 3) * cell;
    } else {
      const double beta = std::min(double(py_floor(mw) * cell) / w, double(py_floor(mh) * cell) / h);
      bh = py_floor(h * beta / double(p)) * p;
      bw = py_floor(w * beta / double(p)) * p;
    }
    grid(bh, bw, &nlh, &nlw);
    if (tokens_for(nlh, nlw) > max_tok || bw <= 0 || bh <= 0)
      return FB_ERROR(kInvalidArgument) << "image " << width << "x" << height << " cannot fit into " << max_tok << " image tokens";
  }
  if (bw > (1 << 20) || bh > (1 << 20)) return FB_ERROR(kInvalidArgument) << "image plan " << bw << "x" << bh << " is too large";
  ImagePlan pl;
  pl.bw = int(bw);
  pl.bh = int(bh);
  pl.nvw = int(bw / p);
  pl.nvh = int(bh / p);
  pl.nlw = int(nlw);
  pl.nlh = int(nlh);
  return pl;
}

// ---- Pillow-compatible BICUBIC ---------------------------------------------------------------
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS

double bicubic(double x) {  // a = -0.5, support 2
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> xmin, xcount;  // per output pixel
  std::vector<int32_t> k;         // [out, ksize] fixed point
};

// precompute_coeffs + normalize_coeffs_8bpc of Pillow's Resample.c, for box (0, in_size).
Coeffs coeffs(int in_size, int out_size) {
  const double scale = double(float(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 2.0 * filterscale;
  Coeffs c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.xmin.resize(size_t(out_size));
  c.xcount.resize(size_t(out_size));
  c.k.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> kk(size_t(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic((x + xmin - center + 0.5) * ss);
      kk[size_t(x)] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      double v = ww != 0.0 ? kk[size_t(x)] / ww : kk[size_t(x)];
      c.k[size_t(xx) * size_t(c.ksize) + size_t(x)] =
          v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    c.xmin[size_t(xx)] = xmin;
    c.xcount[size_t(xx)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecisionBits);
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& in, int out_w, int out_h) {
  FB_CHECK(out_w > 0 && out_h > 0);
  if (out_w == in.width && out_h == in.height) return in;
  const Coeffs ch = coeffs(in.width, out_w), cv = coeffs(in.height, out_h);
  const bool need_h = out_w != in.width, need_v = out_h != in.height;
  // Rows of the source the vertical pass reads (Pillow crops the horizontal pass to them).
  const int y_first = cv.xmin[0];
  const int y_last = cv.xmin[size_t(out_h - 1)] + cv.xcount[size_t(out_h - 1)];
  RgbImage tmp;
  const RgbImage* src = &in;
  int y_off = 0;  // source row of tmp's row 0
  if (need_h) {
    tmp.width = out_w;
    tmp.height = y_last - y_first;
    tmp.rgb.resize(size_t(tmp.width) * size_t(tmp.height) * 3);
    for (int y = 0; y < tmp.height; ++y) {
      for (int xx = 0; xx < out_w; ++xx) {
        const int32_t* k = &ch.k[size_t(xx) * size_t(ch.ksize)];
        const int xmin = ch.xmin[size_t(xx)], n = ch.xcount[size_t(xx)];
        for (int c = 0; c < 3; ++c) {
          int32_t ss = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < n; ++x) ss += int32_t(in.px(x + xmin, y + y_first)[c]) * k[x];
          tmp.rgb[(size_t(y) * size_t(out_w) + size_t(xx)) * 3 + size_t(c)] = clip8(ss);
        }
      }
    }
    src = &tmp;
    y_off = y_first;
  }
  if (!need_v) return tmp;
  RgbImage out;
  out.width = src->width;
  out.height = out_h;
  out.rgb.resize(size_t(out.width) * size_t(out_h) * 3);
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &cv.k[size_t(yy) * size_t(cv.ksize)];
    const int ymin = cv.xmin[size_t(yy)] - y_off, n = cv.xcount[size_t(yy)];
    for (int xx = 0; xx < out.width; ++xx) {
      for (int c = 0; c < 3; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < n; ++y) ss += int32_t(src->px(xx, y + ymin)[c]) * k[y];
        out.rgb[(size_t(yy) * size_t(out.width) + size_t(xx)) * 3 + size_t(c)] = clip8(ss);
      }
    }
  }
  return out;
}

RgbImage pad_image(const RgbImage& in, int bw, int bh, uint8_t fill) {
  // ImageOps.contain: aspect fit by comparing the two ratios as doubles.
  int nw = bw, nh = bh;
  const double im_ratio = double(in.width) / double(in.height), dest_ratio = double(bw) / double(bh);
  if (im_ratio != dest_ratio) {
    if (im_ratio > dest_ratio) nh = int(py_round(double(in.height) / double(in.width) * double(bw)));
    else nw = int(py_round(double(in.width) / double(in.height) * double(bh)));
  }
  if (nw == bw && nh == bh) return resize_bicubic(in, bw, bh);
  RgbImage out;
  out.width = bw;
  out.height = bh;
  out.rgb.assign(size_t(bw) * size_t(bh) * 3, fill);
  if (nw <= 0 || nh <= 0) return out;  // contain() returns an empty image; nothing is pasted
  const RgbImage r = resize_bicubic(in, nw, nh);
  const int x0 = nw != bw ? int(py_round(double(bw - nw) * 0.5)) : 0;
  const int y0 = nw != bw ? 0 : int(py_round(double(bh - nh) * 0.5));
  for (int y = 0; y < nh; ++y)
    std::copy(r.px(0, y), r.px(0, y) + size_t(nw) * 3, &out.rgb[(size_t(y + y0) * size_t(bw) + size_t(x0)) * 3]);
  return out;
}

uint16_t normalized_pixel_bf16(uint8_t p) {
  const float v = float(p) / 255.0f;
  return bf16_bits_from_f32((v - 0.5f) / 0.5f);
}

Result<PreparedImage> preprocess(const RgbImage& img, const model::VisionConfig& vc) {
  PreparedImage out;
  out.plan = FB_TRY(plan_image(img.width, img.height, vc));
  const ImagePlan& pl = out.plan;
  const bool stretch = vc.max_wh_ratio && double(img.width) >= *vc.max_wh_ratio * double(img.height);
  const RgbImage canvas = stretch ? resize_bicubic(img, pl.bw, pl.bh) : pad_image(img, pl.bw, pl.bh, 127);
  uint16_t lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = normalized_pixel_bf16(uint8_t(i));
  const int p = vc.patch_size, pp = p * p;
  out.patches.resize(size_t(pl.n_patches()) * size_t(3 * pp));
  for (int pr = 0; pr < pl.nvh; ++pr)
    for (int pc = 0; pc < pl.nvw; ++pc) {
      uint16_t* dst = &out.patches[(size_t(pr) * size_t(pl.nvw) + size_t(pc)) * size_t(3 * pp)];
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < p; ++y)
          for (int x = 0; x < p; ++x) dst[c * pp + y * p + x] = lut[canvas.px(pc * p + x, pr * p + y)[c]];
    }
  return out;
}

}  // namespace fb::vision
