#include "vision/image.h"

#include <csetjmp>
#include <cstring>

#include "base/mapped_file.h"

#if FB_HAVE_PNG
#include <png.h>
#endif
#if FB_HAVE_JPEG
#include <cstdio>  // jpeglib.h needs FILE
#include <jpeglib.h>
#include <jerror.h>
#endif
#if FB_HAVE_WEBP
#include <webp/decode.h>
#endif

namespace fb::vision {

namespace {

Status check_size(int64_t w, int64_t h, const DecodeLimits& lim, const char* fmt) {
  if (w <= 0 || h <= 0) return FB_ERROR(kInvalidArgument) << fmt << " image has no pixels (" << w << "x" << h << ")";
  if (w > lim.max_side || h > lim.max_side)
    return FB_ERROR(kInvalidArgument) << fmt << " image " << w << "x" << h << " exceeds the side limit " << lim.max_side;
  if (w * h > lim.max_pixels)
    return FB_ERROR(kInvalidArgument) << fmt << " image " << w << "x" << h << " exceeds the pixel limit " << lim.max_pixels;
  return Status();
}

// ---- PNG ----------------------------------------------------------------------------------
#if FB_HAVE_PNG
struct PngReader {
  const uint8_t* p;
  size_t n, off = 0;
  char err[200] = {0};
};

void png_read_cb(png_structp png, png_bytep out, png_size_t len) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->n - r->off < len) png_error(png, "truncated PNG data");
  std::memcpy(out, r->p + r->off, len);
  r->off += len;
}
void png_error_cb(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->err, sizeof r->err, "%s", msg);
  png_longjmp(png, 1);
}
void png_warn_cb(png_structp, png_const_charp) {}

// Pillow parity: palette -> its RGB entries (tRNS ignored), grey -> replicated, low bit depths
// scaled to 8 bits, 16-bit samples keep their high byte (Pillow's "RGB;16B"), alpha dropped.
Result<RgbImage> decode_png(std::string_view bytes, const DecodeLimits& lim) {
  PngReader rd{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &rd, png_error_cb, png_warn_cb);
  if (!png) return FB_ERROR(kOutOfMemory) << "libpng: cannot create a reader";
  png_infop info = png_create_info_struct(png);
  RgbImage img;
  std::vector<png_bytep> rows;
  Status st;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return FB_ERROR(kInvalidArgument) << "malformed PNG: " << rd.err;
  }
  png_set_read_fn(png, &rd, png_read_cb);
  png_set_user_limits(png, uint32_t(std::min<int64_t>(lim.max_side, 0x7fffffff)), uint32_t(std::min<int64_t>(lim.max_side, 0x7fffffff)));
  png_read_info(png, info);
  const int64_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  st = check_size(w, h, lim, "PNG");
  if (!st.ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return st;
  }
  const int ct = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if ((ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  if (ct & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(w) * 3) png_error(png, "unexpected row layout after conversion");
  img.width = int(w);
  img.height = int(h);
  img.rgb.resize(size_t(w) * size_t(h) * 3);
  rows.resize(size_t(h));
  for (int64_t y = 0; y < h; ++y) rows[size_t(y)] = &img.rgb[size_t(y) * size_t(w) * 3];
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return img;
}
#endif

// ---- JPEG ---------------------------------------------------------------------------------
#if FB_HAVE_JPEG
struct JpegErr {
  jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX] = {0};
};
void jpeg_exit_cb(j_common_ptr ci) {
  auto* e = reinterpret_cast<JpegErr*>(ci->err);
  ci->err->format_message(ci, e->msg);
  longjmp(e->jb, 1);
}
// A truncated file only warns in libjpeg (it pads with grey); Pillow refuses it, so do we.
void jpeg_msg_cb(j_common_ptr ci, int level) {
  if (level < 0 && ci->err->msg_code == JWRN_JPEG_EOF) jpeg_exit_cb(ci);
}

Result<RgbImage> decode_jpeg(std::string_view bytes, const DecodeLimits& lim) {
  jpeg_decompress_struct ci;
  JpegErr err;
  ci.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_exit_cb;
  err.pub.emit_message = jpeg_msg_cb;
  RgbImage img;
  std::vector<uint8_t> line;
  if (setjmp(err.jb)) {
    jpeg_destroy_decompress(&ci);
    return FB_ERROR(kInvalidArgument) << "malformed JPEG: " << err.msg;
  }
  jpeg_create_decompress(&ci);
  jpeg_mem_src(&ci, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&ci, TRUE);
  Status st = check_size(ci.image_width, ci.image_height, lim, "JPEG");
  if (!st.ok()) {
    jpeg_destroy_decompress(&ci);
    return st;
  }
  const bool cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
  ci.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&ci);
  const int w = int(ci.output_width), h = int(ci.output_height), nc = ci.output_components;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w) * size_t(h) * 3);
  line.resize(size_t(w) * size_t(nc));
  // Adobe CMYK JPEGs store inverted ink; Pillow reads them as "CMYK;I" and converts with
  // rgb = 255 - min(255, ink + k) folded into its integer MULDIV255 form.
  const bool inverted = cmyk && ci.saw_Adobe_marker;
  while (ci.output_scanline < ci.output_height) {
    const int y = int(ci.output_scanline);
    JSAMPROW row = line.data();
    jpeg_read_scanlines(&ci, &row, 1);
    uint8_t* out = &img.rgb[size_t(y) * size_t(w) * 3];
    if (!cmyk) {
      std::memcpy(out, line.data(), size_t(w) * 3);
      continue;
    }
    for (int x = 0; x < w; ++x) {
      int v[4];
      for (int c = 0; c < 4; ++c) v[c] = inverted ? 255 - line[size_t(x) * 4 + size_t(c)] : line[size_t(x) * 4 + size_t(c)];
      const int nk = 255 - v[3];
      for (int c = 0; c < 3; ++c) {
        const int t = v[c] * nk + 128;
        const int r = nk - (((t >> 8) + t) >> 8);
        out[size_t(x) * 3 + size_t(c)] = uint8_t(r < 0 ? 0 : r > 255 ? 255 : r);
      }
    }
  }
  jpeg_finish_decompress(&ci);
  jpeg_destroy_decompress(&ci);
  return img;
}
#endif

// ---- WebP ---------------------------------------------------------------------------------
#if FB_HAVE_WEBP
Result<RgbImage> decode_webp(std::string_view bytes, const DecodeLimits& lim) {
  WebPBitstreamFeatures f;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (WebPGetFeatures(p, bytes.size(), &f) != VP8_STATUS_OK) return FB_ERROR(kInvalidArgument) << "malformed WebP header";
  if (f.has_animation) return FB_ERROR(kUnsupported) << "animated WebP is not supported";
  FB_RETURN_IF_ERROR(check_size(f.width, f.height, lim, "WebP"));
  RgbImage img;
  img.width = f.width;
  img.height = f.height;
  img.rgb.resize(size_t(f.width) * size_t(f.height) * 3);
  if (!WebPDecodeRGBInto(p, bytes.size(), img.rgb.data(), img.rgb.size(), f.width * 3))
    return FB_ERROR(kInvalidArgument) << "malformed WebP data";
  return img;
}
#endif

bool starts_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(0, p.size()) == p; }

// The formats we read, in the order their magic bytes are tried; decode is null where this build
// lacks the library.
struct ImageFormat {
  const char* name;   // as decoders_available lists it
  const char* label;  // in messages
  const char* library;
  bool (*matches)(std::string_view bytes);
  Result<RgbImage> (*decode)(std::string_view bytes, const DecodeLimits& limits);
};
const ImageFormat kImageFormats[] = {
    {"png", "PNG", "libpng", [](std::string_view b) { return starts_with(b, "\x89PNG\r\n\x1a\n"); },
#if FB_HAVE_PNG
     decode_png},
#else
     nullptr},
#endif
    {"jpeg", "JPEG", "libjpeg", [](std::string_view b) { return starts_with(b, "\xff\xd8\xff"); },
#if FB_HAVE_JPEG
     decode_jpeg},
#else
     nullptr},
#endif
    {"webp", "WebP", "libwebp", [](std::string_view b) { return b.size() >= 12 && starts_with(b, "RIFF") && b.substr(8, 4) == "WEBP"; },
#if FB_HAVE_WEBP
     decode_webp},
#else
     nullptr},
#endif
};

}  // namespace

std::string decoders_available() {
  std::string s;
  for (const ImageFormat& f : kImageFormats)
    if (f.decode) s += std::string(s.empty() ? "" : " ") + f.name;
  return s;
}

Result<RgbImage> decode_image(std::string_view b, const DecodeLimits& limits) {
  for (const ImageFormat& f : kImageFormats) {
    if (!f.matches(b)) continue;
    if (!f.decode) return FB_ERROR(kUnsupported) << "this build has no " << f.label << " decoder (" << f.library << ")";
    return f.decode(b, limits);
  }
  if (starts_with(b, "GIF87a") || starts_with(b, "GIF89a")) return FB_ERROR(kUnsupported) << "GIF images are not supported (use PNG, JPEG or WebP)";
  return FB_ERROR(kInvalidArgument) << "unrecognised image format (expected PNG, JPEG or WebP; have: " << decoders_available() << ")";
}

Result<std::string> base64_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (char ch : s) {
    int v;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+' || ch == '-') v = 62;
    else if (ch == '/' || ch == '_') v = 63;
    else if (ch == '=') {
      ++pad;
      continue;
    } else if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') {
      continue;
    } else {
      return FB_ERROR(kInvalidArgument) << "base64: invalid character (code " << int(uint8_t(ch)) << ")";
    }
    if (pad) return FB_ERROR(kInvalidArgument) << "base64: data after padding";
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  if (bits >= 6) return FB_ERROR(kInvalidArgument) << "base64: truncated input";
  return out;
}

Result<std::string> load_image_bytes(const std::string& u) {
  if (starts_with(u, "data:")) {
    const size_t comma = u.find(',');
    if (comma == std::string::npos) return FB_ERROR(kInvalidArgument) << "data URL without ','";
    const std::string_view header(u.data(), comma);
    if (header.find(";base64") == std::string_view::npos)
      return FB_ERROR(kInvalidArgument) << "unsupported data URL encoding (want ;base64): " << header;
    return base64_decode(std::string_view(u).substr(comma + 1));
  }
  if (starts_with(u, "http://") || starts_with(u, "https://"))
    return FB_ERROR(kUnsupported) << "network image URLs are not fetched; send the image as a data URL";
  std::string path = starts_with(u, "file://") ? u.substr(7) : u;
  return read_file_bytes(path);
}

}  // namespace fb::vision
