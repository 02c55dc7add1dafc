#include "loader/snapshot.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "loader/safetensors.h"

namespace fb::loader {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ValidationReport::to_string(size_t max_per_kind) const {
  std::string s;
  auto section = [&](const char* title, const std::vector<std::string>& v) {
    if (v.empty()) return;
    s += std::string(title) + " (" + std::to_string(v.size()) + "):\n";
    for (size_t i = 0; i < v.size() && i < max_per_kind; ++i) s += "  " + v[i] + "\n";
    if (v.size() > max_per_kind) s += "  ... and " + std::to_string(v.size() - max_per_kind) + " more\n";
  };
  section("missing tensors", missing);
  section("unexpected tensors", unexpected);
  section("mismatched tensors", mismatched);
  section("other problems", other);
  return s;
}

Result<std::unique_ptr<Snapshot>> Snapshot::open(const std::string& dir) {
  auto snap = std::unique_ptr<Snapshot>(new Snapshot());
  snap->dir_ = dir;
  if (!fs::is_directory(dir)) return FB_ERROR(kNotFound) << dir << ": not a directory";
  snap->config_ = FB_TRY(model::Config::from_file((fs::path(dir) / "config.json").string()));

  // Shard list: the index when present, else a single model.safetensors.
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  if (fs::exists(index_path)) {
    std::string text = FB_TRY(read_file_bytes(index_path.string()));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return FB_ERROR(kCorrupt) << index_path.string() << ": not a JSON object";
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) return FB_ERROR(kCorrupt) << index_path.string() << ": missing weight_map object";
    std::set<std::string> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) return FB_ERROR(kCorrupt) << index_path.string() << ": weight_map[\"" << it.key() << "\"] is not a file name";
      std::string f = it->get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return FB_ERROR(kCorrupt) << index_path.string() << ": weight_map[\"" << it.key() << "\"] names an invalid file \"" << f << "\"";
      weight_map[it.key()] = f;
      shards.insert(f);
    }
    shard_names.assign(shards.begin(), shards.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return FB_ERROR(kNotFound) << dir << ": no model.safetensors.index.json (and no model.safetensors)";
  }

  for (const std::string& shard : shard_names) {
    const std::string path = (fs::path(dir) / shard).string();
    auto mf = MappedFile::open(path);
    if (!mf.ok()) return mf.status().with_context("shard named by the index");
    SafetensorsHeader hdr = FB_TRY(parse_safetensors(mf->data(), mf->size(), path));
    for (auto& e : hdr.entries) {
      if (snap->tensors_.count(e.name))
        return FB_ERROR(kCorrupt) << path << ": tensor \"" << e.name << "\" also appears in " << snap->tensors_[e.name].shard;
      Entry ent;
      ent.view.dtype = e.dtype;
      ent.view.shape = e.shape;
      ent.view.data = mf->data() + hdr.data_start + e.begin;
      ent.shard = shard;
      ent.file_offset = hdr.data_start + e.begin;
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end()) {
          snap->index_problems_.push_back(e.name + ": present in " + shard + " but not in the index");
        } else if (it->second != shard) {
          snap->index_problems_.push_back(e.name + ": index says " + it->second + ", found in " + shard);
        }
      }
      snap->tensors_.emplace(e.name, std::move(ent));
    }
    snap->files_.push_back(std::move(mf.value()));
  }
  for (const auto& [name, shard] : weight_map)
    if (!snap->tensors_.count(name)) snap->index_problems_.push_back(name + ": the index names " + shard + " but the shard does not hold it");

  const fs::path map_path = fs::path(dir) / "engram_token_map.i32";
  if (fs::exists(map_path)) {
    std::string bytes = FB_TRY(read_file_bytes(map_path.string()));
    if (bytes.size() % 4) return FB_ERROR(kCorrupt) << map_path.string() << ": size is not a multiple of 4";
    snap->engram_map_.resize(bytes.size() / 4);
    std::memcpy(snap->engram_map_.data(), bytes.data(), bytes.size());
  }
  return snap;
}

std::unique_ptr<Snapshot> Snapshot::in_memory(model::Config config, std::map<std::string, TensorView> tensors,
                                              std::vector<std::vector<uint8_t>> storage, std::vector<int32_t> engram_map) {
  auto snap = std::unique_ptr<Snapshot>(new Snapshot());
  snap->dir_ = "(in memory)";
  snap->config_ = std::move(config);
  for (auto& [name, view] : tensors) snap->tensors_[name] = Entry{view, "(memory)", 0};
  snap->storage_ = std::move(storage);
  snap->engram_map_ = std::move(engram_map);
  return snap;
}

const TensorView& Snapshot::get(const std::string& name) const {
  auto it = tensors_.find(name);
  FB_CHECK(it != tensors_.end()) << "tensor " << name << " is not in the snapshot";
  return it->second.view;
}

Result<TensorView> Snapshot::find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return FB_ERROR(kNotFound) << dir_ << ": no tensor \"" << name << "\"";
  return it->second.view;
}

std::vector<std::string> Snapshot::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : tensors_) out.push_back(n);
  return out;
}

const std::string& Snapshot::shard_of(const std::string& name) const {
  auto it = tensors_.find(name);
  FB_CHECK(it != tensors_.end());
  return it->second.shard;
}

Result<TensorLocation> Snapshot::locate(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return FB_ERROR(kNotFound) << dir_ << ": no tensor \"" << name << "\"";
  return TensorLocation{(std::filesystem::path(dir_) / it->second.shard).string(), it->second.file_offset,
                        uint64_t(it->second.view.nbytes())};
}

Status validate_engram_map(const model::Config& c, const std::vector<int32_t>& map) {
  if (int64_t(map.size()) != c.vocab_size)
    return FB_ERROR(kInvalidArgument) << "engram token map has " << map.size() << " entries, vocab_size is " << c.vocab_size;
  std::vector<uint8_t> used(size_t(std::max<int64_t>(c.engram_compressed_vocab, 0)), 0);
  int64_t distinct = 0;
  for (size_t i = 0; i < map.size(); ++i) {
    int32_t k = map[i];
    if (k < 0 || k >= c.engram_compressed_vocab)
      return FB_ERROR(kInvalidArgument) << "engram token map: token " << i << " maps to class " << k << ", outside [0, " << c.engram_compressed_vocab << ")";
    if (!used[size_t(k)]) {
      used[size_t(k)] = 1;
      ++distinct;
    }
  }
  if (distinct != c.engram_compressed_vocab)
    return FB_ERROR(kInvalidArgument) << "engram token map has " << distinct << " classes, config says engram_compressed_vocab_size = " << c.engram_compressed_vocab;
  return Status();
}

Status check_runnable(const Snapshot& snap, std::vector<int32_t>* token_map) {
  ValidationReport rep = snap.validate();
  if (!rep.ok()) return FB_ERROR(kCorrupt) << snap.dir() << ": checkpoint does not match its config:\n" << rep.to_string();
  const model::Config& c = snap.config();
  if (token_map->empty()) *token_map = snap.engram_token_map();
  if (!c.engram_layer_ids.empty()) {
    if (token_map->empty())
      return FB_ERROR(kNotFound) << snap.dir() << ": the model uses Engram but no token map was found (engram_token_map.i32 beside config.json)";
    FB_RETURN_IF_ERROR(validate_engram_map(c, *token_map));
  }
  return Status();
}

ValidationReport Snapshot::validate() const {
  ValidationReport rep;
  rep.other = index_problems_;
  const auto specs = model::expected_tensors(config_);
  std::set<std::string> expected;
  for (const auto& s : specs) {
    expected.insert(s.name);
    auto it = tensors_.find(s.name);
    if (it == tensors_.end()) {
      rep.missing.push_back(s.name + " " + dtype_name(s.dtype) + " " + shape_string(s.shape));
      continue;
    }
    const TensorView& v = it->second.view;
    if (v.dtype != s.dtype || v.shape != s.shape)
      rep.mismatched.push_back(s.name + ": want " + dtype_name(s.dtype) + " " + shape_string(s.shape) + ", have " + dtype_name(v.dtype) + " " +
                               shape_string(v.shape) + " (" + it->second.shard + ")");
  }
  for (const auto& [name, e] : tensors_)
    if (!expected.count(name)) rep.unexpected.push_back(name + " " + dtype_name(e.view.dtype) + " " + shape_string(e.view.shape) + " (" + e.shard + ")");
  if (!config_.engram_layer_ids.empty() && !engram_map_.empty()) {
    Status st = validate_engram_map(config_, engram_map_);
    if (!st.ok()) rep.other.push_back("engram_token_map.i32: " + st.message());
  }
  return rep;
}

uint64_t model_identity(const Snapshot& snap) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  bool hashed = false;
  for (const char* f : {"config.json", "model.safetensors.index.json"}) {
    if (snap.dir().empty()) break;
    auto b = read_file_bytes(snap.dir() + "/" + f);
    if (!b.ok()) continue;
    mix(b->data(), b->size());
    hashed = true;
  }
  const model::Config& c = snap.config();
  if (!hashed)
    for (int64_t v : {int64_t(c.n_layers), int64_t(c.dim), int64_t(c.vocab_size), int64_t(c.head_dim), int64_t(c.window_size)}) mix(&v, sizeof v);
  return h;
}

}  // namespace fb::loader
