#include "loader/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/mapped_file.h"

namespace fb::loader {

using json = nlohmann::json;

Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& file) {
  if (size < 8) return FB_ERROR(kCorrupt) << file << ": " << size << " bytes, too short for a safetensors header";
  uint64_t n = 0;
  std::memcpy(&n, data, 8);  // little-endian host (x86-64, aarch64)
  if (n > kMaxHeaderBytes) return FB_ERROR(kCorrupt) << file << ": header length " << n << " exceeds the " << kMaxHeaderBytes << "-byte limit";
  if (n > size - 8) return FB_ERROR(kCorrupt) << file << ": header length " << n << " runs past the end of the file (" << size << " bytes): truncated?";
  const char* h = reinterpret_cast<const char*>(data + 8);
  json j = json::parse(h, h + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return FB_ERROR(kCorrupt) << file << ": header is not a JSON object";
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t data_size = size - out.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) return FB_ERROR(kCorrupt) << file << ": __metadata__ must be an object";
      continue;
    }
    const json& e = *it;
    auto bad = [&](const char* why) { return Status(FB_ERROR(kCorrupt) << file << ": tensor \"" << name << "\": " << why); };
    if (!e.is_object()) return bad("entry is not an object");
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string()) return bad("missing dtype string");
    if (sh == e.end() || !sh->is_array()) return bad("missing shape list");
    if (off == e.end() || !off->is_array() || off->size() != 2) return bad("data_offsets must be [begin, end]");
    SafetensorsEntry ent;
    ent.name = name;
    if (!parse_dtype(dt->get<std::string>(), &ent.dtype)) return bad(("unknown dtype " + dt->get<std::string>()).c_str());
    if (sh->size() > 8) return bad("more than 8 dimensions");
    unsigned __int128 numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) return bad("shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 48)) return bad("absurd dimension");
      ent.shape.push_back(int64_t(v));
      numel *= v;
      if (numel > (unsigned __int128)(1ull << 62)) return bad("element count overflows");
    }
    for (const json& o : *off)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) return bad("data_offsets must be non-negative integers");
    ent.begin = (*off)[0].get<uint64_t>();
    ent.end = (*off)[1].get<uint64_t>();
    if (ent.begin > ent.end) return bad("data_offsets begin > end");
    if (ent.end > data_size)
      return FB_ERROR(kCorrupt) << file << ": tensor \"" << name << "\" ends at data offset " << ent.end << " but the data area has " << data_size << " bytes: truncated shard?";
    unsigned __int128 want = numel * dtype_size(ent.dtype);
    if (want != (unsigned __int128)(ent.end - ent.begin))
      return FB_ERROR(kCorrupt) << file << ": tensor \"" << name << "\" spans " << (ent.end - ent.begin) << " bytes but " << dtype_name(ent.dtype)
                                << " " << uint64_t(numel) << " elements need " << uint64_t(want);
    out.entries.push_back(std::move(ent));
  }
  // Overlap check over the data area.
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : out.entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->end)
      return FB_ERROR(kCorrupt) << file << ": tensors \"" << sorted[i - 1]->name << "\" and \"" << sorted[i]->name << "\" overlap";
  }
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    json e;
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + t.bytes.size()};
    off += t.bytes.size();
    h[t.name] = std::move(e);
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  std::string out;
  out.reserve(8 + hs.size() + off);
  uint64_t n = hs.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += hs;
  for (const auto& t : tensors) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return write_file_atomic(path, out.data(), out.size());
}

}  // namespace fb::loader
