// Image bytes -> decoded 8-bit RGB (spec/14 §3.1): PNG (libpng), JPEG (libjpeg), WebP (libwebp),
// from raw bytes, base64 data URLs or local files. Never fetches from the network. Alpha is
// DROPPED (not composited), as Pillow's convert("RGB") does; no EXIF orientation. Every malformed
// input is a Status, never a crash: library errors are caught at this boundary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fb::vision {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3] u8, row-major
  const uint8_t* px(int x, int y) const { return &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3]; }
};

struct DecodeLimits {
  int64_t max_side = 65535;
  // Pillow refuses images above 2 x 89,478,485 pixels (DecompressionBombError); so do we.
  int64_t max_pixels = 178956970;
};

// Decodes PNG / JPEG / WebP, detected from the leading bytes (not from a name or MIME type).
Result<RgbImage> decode_image(std::string_view bytes, const DecodeLimits& limits = {});

// "data:<mime>;base64,<payload>" -> bytes; a local path -> file bytes; http(s) -> kUnsupported.
Result<std::string> load_image_bytes(const std::string& url_or_path);

// RFC 4648 base64 (whitespace skipped, padding optional); other characters are an error.
Result<std::string> base64_decode(std::string_view s);

// Which decoders this build has ("png jpeg webp").
std::string decoders_available();

}  // namespace fb::vision
