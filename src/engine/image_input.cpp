#include "engine/image_input.h"

#include "base/mapped_file.h"
#include "vision/pipeline.h"

namespace fb::engine {

using ojson = nlohmann::ordered_json;

namespace {

bool is_image_type(const ojson& p) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) return false;
  const std::string t = p["type"].get<std::string>();
  return t == "image_url" || t == "image";
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

Result<std::string> bytes_from_url(const std::string& url, const ImagePolicy& policy) {
  if (url.empty()) return FB_ERROR(kInvalidArgument) << "empty image URL";
  if (starts_with(url, "data:")) {
    // base64 grows 4/3: refuse before decoding what cannot fit.
    if (url.size() / 4 * 3 > policy.max_bytes + 3)
      return FB_ERROR(kInvalidArgument) << "image is larger than " << (policy.max_bytes >> 20) << " MiB";
    return vision::load_image_bytes(url);
  }
  if (starts_with(url, "http://") || starts_with(url, "https://"))
    return FB_ERROR(kInvalidArgument) << "image URLs are not fetched (this server makes no network requests); send the image inline as a "
                                         "base64 data URL (data:image/png;base64,...)";
  const size_t colon = url.find(':'), slash = url.find('/');
  const bool other_scheme = !starts_with(url, "file://") && colon != std::string::npos && colon > 1 && (slash == std::string::npos || colon < slash);
  if (other_scheme) return FB_ERROR(kInvalidArgument) << "unsupported image URL scheme (use a base64 data URL)";
  if (!policy.allow_local)
    return FB_ERROR(kInvalidArgument) << "local image files are disabled (start the server with --allow-local-images); send the image as a "
                                         "base64 data URL";
  const std::string path = starts_with(url, "file://") ? url.substr(7) : url;
  auto b = read_file_bytes(path);
  if (!b.ok()) return FB_ERROR(kInvalidArgument) << "cannot read local image " << path;
  return std::move(b).value();
}

}  // namespace

std::vector<ojson> collect_image_parts(const ojson& messages) {
  std::vector<ojson> out;
  if (!messages.is_array()) return out;
  for (const ojson& m : messages) {
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    for (const ojson& p : m["content"]) {
      if (is_image_type(p)) {
        out.push_back(p);
      } else if (p.is_object() && p.value("type", "") == "tool_result" && p.contains("content") && p["content"].is_array()) {
        for (const ojson& q : p["content"])
          if (is_image_type(q)) out.push_back(q);
      }
    }
  }
  return out;
}

Result<std::string> image_part_bytes(const ojson& part, const ImagePolicy& policy) {
  std::string bytes;
  const std::string type = part.value("type", "");
  if (type == "image_url") {
    const ojson& u = part.contains("image_url") ? part["image_url"] : ojson();
    std::string url;
    if (u.is_string()) url = u.get<std::string>();
    else if (u.is_object() && u.contains("url") && u["url"].is_string()) url = u["url"].get<std::string>();
    else return FB_ERROR(kInvalidArgument) << "image_url must be a string or an object with a string 'url'";
    bytes = FB_TRY(bytes_from_url(url, policy));
  } else {  // "image": Anthropic {source: {type: base64, media_type, data} | {type: url, url}}, or internal url/data
    if (part.contains("source") && part["source"].is_object()) {
      const ojson& s = part["source"];
      const std::string st = s.value("type", "");
      if (st == "base64") {
        if (!s.contains("data") || !s["data"].is_string()) return FB_ERROR(kInvalidArgument) << "image source needs a string 'data'";
        const std::string& d = s["data"].get_ref<const std::string&>();
        if (d.size() / 4 * 3 > policy.max_bytes + 3)
          return FB_ERROR(kInvalidArgument) << "image is larger than " << (policy.max_bytes >> 20) << " MiB";
        bytes = FB_TRY(vision::base64_decode(d));
      } else if (st == "url") {
        if (!s.contains("url") || !s["url"].is_string()) return FB_ERROR(kInvalidArgument) << "image source needs a string 'url'";
        bytes = FB_TRY(bytes_from_url(s["url"].get<std::string>(), policy));
      } else {
        return FB_ERROR(kInvalidArgument) << "image source type must be \"base64\" or \"url\"";
      }
    } else if (part.contains("data") && part["data"].is_string()) {
      bytes = FB_TRY(vision::base64_decode(part["data"].get<std::string>()));
    } else if (part.contains("url") && part["url"].is_string()) {
      bytes = FB_TRY(bytes_from_url(part["url"].get<std::string>(), policy));
    } else {
      return FB_ERROR(kInvalidArgument) << "image block needs a 'source'";
    }
  }
  if (bytes.empty()) return FB_ERROR(kInvalidArgument) << "empty image";
  if (bytes.size() > policy.max_bytes) return FB_ERROR(kInvalidArgument) << "image is larger than " << (policy.max_bytes >> 20) << " MiB";
  return bytes;
}

Status expand_images(const std::vector<ojson>& parts, const ImagePolicy& policy, int32_t image_token_id, Request* req) {
  if (parts.empty()) return Status();
  if (!policy.vision) return FB_ERROR(kInvalidArgument) << "model has no vision tower: image input is not available";
  if (int64_t(parts.size()) > policy.max_images)
    return FB_ERROR(kInvalidArgument) << "too many images: " << parts.size() << " (at most " << policy.max_images << " per request)";
  std::vector<size_t> at;
  for (size_t p = 0; p < req->prompt.size(); ++p)
    if (req->prompt[p] == image_token_id) at.push_back(p);
  if (at.size() != parts.size())
    return FB_ERROR(kInvalidArgument) << "the prompt has " << at.size() << " image placeholders for " << parts.size() << " images";
  std::vector<int32_t> out;
  size_t prev = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto bytes = image_part_bytes(parts[i], policy);
    if (!bytes.ok()) return FB_ERROR(kInvalidArgument) << "image " << i << ": " << bytes.status().message();
    auto pi = vision::load_image(*bytes, *policy.vision, policy.limits);
    if (!pi.ok()) {
      if (pi.status().code() == StatusCode::kOutOfMemory) return pi.status();
      return FB_ERROR(kInvalidArgument) << "image " << i << ": " << pi.status().message();
    }
    out.insert(out.end(), req->prompt.begin() + ptrdiff_t(prev), req->prompt.begin() + ptrdiff_t(at[i]));
    engine::ImageInput im;
    im.pos = int64_t(out.size());
    im.nvh = pi->plan.nvh;
    im.nvw = pi->plan.nvw;
    im.patches = std::move(pi->patches);
    im.hash = pi->hash;
    out.insert(out.end(), size_t(pi->plan.span_tokens()), image_token_id);
    req->images.push_back(std::move(im));
    prev = at[i] + 1;
  }
  out.insert(out.end(), req->prompt.begin() + ptrdiff_t(prev), req->prompt.end());
  req->prompt = std::move(out);
  return Status();
}

}  // namespace fb::engine
