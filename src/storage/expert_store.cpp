#include "storage/expert_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/check.h"
#include "base/mapped_file.h"
#include "model/schema.h"
#include "storage/aligned_buffer.h"
#include "base/crc32c.h"

namespace fb::storage {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPartNames[6] = {"w1.weight", "w1.scale", "w3.weight", "w3.scale", "w2.weight", "w2.scale"};

std::string expert_name(const model::Config& c, int l, int e, int part) {
  return model::layer_prefix(c, l) + "ffn.experts." + std::to_string(e) + "." + kPartNames[part];
}

struct Writer {
  std::vector<uint8_t> b;
  template <typename T>
  void put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(&b[n], &v, sizeof(T));
  }
};

struct Parser {
  const uint8_t* p;
  size_t n, at = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (at + sizeof(T) > n) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::vector<uint8_t> encode_header(const ExpertLayout& lay, uint64_t identity, const std::vector<int>& n_experts,
                                   const std::vector<uint32_t>& crcs, uint64_t* data_start) {
  Writer w;
  for (char ch : kStoreMagic) w.put<char>(ch);
  w.put<uint32_t>(kStoreVersion);
  w.put<uint32_t>(uint32_t(n_experts.size()));
  w.put<uint64_t>(identity);
  w.put<uint64_t>(lay.stride_bytes);
  for (const ExpertPart& p : lay.parts) {
    w.put<uint32_t>(uint32_t(p.dtype));
    w.put<uint32_t>(uint32_t(p.shape.size()));
    for (size_t i = 0; i < 2; ++i) w.put<int64_t>(i < p.shape.size() ? p.shape[i] : 0);
    w.put<uint64_t>(p.offset);
    w.put<uint64_t>(p.nbytes);
  }
  for (int n : n_experts) w.put<uint32_t>(uint32_t(n));
  for (uint32_t c : crcs) w.put<uint32_t>(c);
  w.put<uint32_t>(crc32c(w.b.data(), w.b.size()));
  *data_start = align_up(w.b.size());
  w.b.resize(*data_start, 0);
  return w.b;
}

Status write_all(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return FB_ERROR(kIo) << path << ": write failed: " << std::strerror(errno) << " (disk full?)";
    p += r;
    n -= size_t(r);
    off += uint64_t(r);
  }
  return Status();
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FB_ERROR(kIo) << dir << ": " << std::strerror(errno);
  ::fsync(fd);
  ::close(fd);
  return Status();
}

// Streams `src` into `dir/experts.fbx` via a temp file: fsync, rename, fsync dir. `progress`
// (optional) gets (bytes copied, bytes) after each 8 MiB chunk.
Status copy_atomic(const std::string& src, const std::string& dir, const std::function<void(int64_t, int64_t)>& progress) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string tmp = dir + "/" + kStoreFile + ".tmp", dst = dir + "/" + kStoreFile;
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return FB_ERROR(kIo) << src << ": " << std::strerror(errno);
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in);
    return FB_ERROR(kIo) << tmp << ": " << std::strerror(errno);
  }
  std::vector<uint8_t> buf(8 << 20);
  uint64_t off = 0;
  Status st;
  struct stat sb {};
  const int64_t size = ::fstat(in, &sb) == 0 ? int64_t(sb.st_size) : 0;
  if (progress) progress(0, size);
  for (;;) {
    const ssize_t r = ::pread(in, buf.data(), buf.size(), off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) st = FB_ERROR(kIo) << src << ": " << std::strerror(errno);
    if (r <= 0) break;
    st = write_all(out, buf.data(), size_t(r), off, tmp);
    if (!st.ok()) break;
    off += uint64_t(r);
    if (progress) progress(int64_t(off), size);
  }
  if (st.ok() && ::fsync(out) != 0) st = FB_ERROR(kIo) << tmp << ": fsync: " << std::strerror(errno);
  ::close(in);
  ::close(out);
  if (st.ok() && ::rename(tmp.c_str(), dst.c_str()) != 0) st = FB_ERROR(kIo) << "rename " << tmp << ": " << std::strerror(errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_dir(dir);
}

}  // namespace

model::ExpertWeights ExpertLayout::view(const uint8_t* record) const {
  auto tv = [&](int i) {
    TensorView v;
    v.dtype = parts[size_t(i)].dtype;
    v.shape = parts[size_t(i)].shape;
    v.data = record + parts[size_t(i)].offset;
    return v;
  };
  model::ExpertWeights w;
  w.w1 = {tv(0), tv(1)};
  w.w3 = {tv(2), tv(3)};
  w.w2 = {tv(4), tv(5)};
  return w;
}

Result<ExpertLayout> expert_layout(const loader::Snapshot& snap) {
  const model::Config& c = snap.config();
  int first = -1;
  for (int l = 0; l < c.n_total_layers() && first < 0; ++l)
    if (c.roles[size_t(l)].n_experts > 0) first = l;
  if (first < 0) return FB_ERROR(kInvalidArgument) << snap.dir() << ": the model has no routed experts";
  ExpertLayout lay;
  uint64_t off = 0;
  for (int i = 0; i < 6; ++i) {
    const TensorView v = FB_TRY(snap.find(expert_name(c, first, 0, i)));
    lay.parts[size_t(i)] = {v.dtype, v.shape, off, uint64_t(v.nbytes())};
    off += align_up(v.nbytes());
  }
  lay.stride_bytes = off;
  return lay;
}

Result<uint64_t> model_identity(const std::string& dir) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(FB_TRY(read_file_bytes(dir + "/config.json")), h);
  if (fs::exists(dir + "/model.safetensors.index.json")) h = fnv1a(FB_TRY(read_file_bytes(dir + "/model.safetensors.index.json")), h);
  return h;
}

uint64_t ExpertStore::record_offset(int layer, int e) const {
  FB_CHECK(e >= 0 && e < n_experts(layer)) << "expert " << e << " of layer " << layer;
  return data_start_ + (layer_first_[size_t(layer)] + size_t(e)) * layout_.stride_bytes;
}

uint32_t ExpertStore::record_crc(int layer, int e) const { return crcs_[layer_first_[size_t(layer)] + size_t(e)]; }

Result<std::unique_ptr<ExpertStore>> ExpertStore::open(const std::string& dir, uint64_t identity) {
  const std::string path = dir + "/" + kStoreFile;
  auto mf = MappedFile::open(path);
  if (!mf.ok()) return mf.status();
  auto s = std::make_unique<ExpertStore>();
  Parser p{mf->data(), mf->size()};
  char magic[8];
  for (char& ch : magic) ch = p.get<char>();
  if (!p.ok || std::memcmp(magic, kStoreMagic, 8) != 0) return FB_ERROR(kCorrupt) << path << ": not an expert store (bad magic)";
  const uint32_t version = p.get<uint32_t>();
  if (version != kStoreVersion) return FB_ERROR(kUnsupported) << path << ": store version " << version << ", this build reads " << kStoreVersion;
  const uint32_t n_layers = p.get<uint32_t>();
  s->identity_ = p.get<uint64_t>();
  s->layout_.stride_bytes = p.get<uint64_t>();
  if (n_layers > 4096) return FB_ERROR(kCorrupt) << path << ": implausible layer count " << n_layers;
  for (ExpertPart& part : s->layout_.parts) {
    part.dtype = DType(p.get<uint32_t>());
    const uint32_t rank = p.get<uint32_t>();
    int64_t sh[2] = {p.get<int64_t>(), p.get<int64_t>()};
    if (rank > 2) return FB_ERROR(kCorrupt) << path << ": bad part rank";
    part.shape.assign(sh, sh + rank);
    part.offset = p.get<uint64_t>();
    part.nbytes = p.get<uint64_t>();
    if (part.offset + part.nbytes > s->layout_.stride_bytes) return FB_ERROR(kCorrupt) << path << ": part outside its record";
  }
  size_t total = 0;
  for (uint32_t l = 0; l < n_layers; ++l) {
    s->layer_first_.push_back(total);
    s->n_experts_.push_back(int(p.get<uint32_t>()));
    total += size_t(s->n_experts_.back());
  }
  if (!p.ok || total > (1u << 24)) return FB_ERROR(kCorrupt) << path << ": truncated header";
  for (size_t i = 0; i < total; ++i) s->crcs_.push_back(p.get<uint32_t>());
  const size_t covered = p.at;
  const uint32_t crc = p.get<uint32_t>();
  if (!p.ok) return FB_ERROR(kCorrupt) << path << ": truncated header";
  if (crc32c(mf->data(), covered) != crc) return FB_ERROR(kCorrupt) << path << ": header checksum mismatch";
  s->data_start_ = align_up(p.at);
  if (s->layout_.stride_bytes % kDirectAlign) return FB_ERROR(kCorrupt) << path << ": record stride not 4 KiB aligned";
  const uint64_t need = s->data_start_ + total * s->layout_.stride_bytes;
  if (mf->size() < need) return FB_ERROR(kCorrupt) << path << ": " << mf->size() << " B, the header describes " << need << " B (truncated copy?)";
  if (identity && s->identity_ != identity)
    return FB_ERROR(kInvalidArgument) << path << ": written for another model (identity " << std::hex << s->identity_ << ", this model "
                                      << identity << "); re-run flashbox convert";
  return s;
}

Status ExpertStore::verify_all(ReplicaReader& reader, const std::function<void(int64_t, int64_t)>& progress) const {
  AlignedBuffer buf(layout_.stride_bytes);
  int64_t total = 0, done = 0;
  for (int l = 0; l < n_layers(); ++l) total += n_experts(l);
  if (progress) progress(0, total);
  for (int l = 0; l < n_layers(); ++l)
    for (int e = 0; e < n_experts(l); ++e) {
      FB_RETURN_IF_ERROR(reader.read({{kStoreFile, record_offset(l, e), layout_.stride_bytes, buf.data()}}));
      if (crc32c(buf.data(), layout_.stride_bytes) != record_crc(l, e))
        return FB_ERROR(kCorrupt) << kStoreFile << ": expert " << e << " of layer " << l << " fails its checksum";
      ++done;
      if (progress && (done % 64 == 0 || done == total)) progress(done, total);
    }
  return Status();
}

Status write_expert_store(const loader::Snapshot& snap, const std::string& out_dir, const std::vector<std::string>& replica_dirs,
                          const std::function<void(const ConvertProgress&)>& progress) {
  const model::Config& c = snap.config();
  const ExpertLayout lay = FB_TRY(expert_layout(snap));
  const uint64_t identity = FB_TRY(model_identity(snap.dir()));
  std::vector<int> n_experts;
  size_t total = 0;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    n_experts.push_back(c.roles[size_t(l)].n_experts);
    total += size_t(n_experts.back());
  }
  std::vector<uint32_t> crcs(total, 0);
  uint64_t data_start = 0;
  encode_header(lay, identity, n_experts, crcs, &data_start);  // size only; rewritten at the end

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  const std::string tmp = out_dir + "/" + kStoreFile + ".tmp", dst = out_dir + "/" + kStoreFile;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FB_ERROR(kIo) << tmp << ": " << std::strerror(errno);
  Status st;
  AlignedBuffer rec(lay.stride_bytes);
  size_t i = 0;
  ConvertProgress prog{ConvertProgress::Phase::kWrite, 0, int64_t(total), out_dir};
  for (int l = 0; l < c.n_total_layers() && st.ok(); ++l)
    for (int e = 0; e < n_experts[size_t(l)] && st.ok(); ++e, ++i) {
      std::memset(rec.data(), 0, lay.stride_bytes);
      for (int p = 0; p < 6 && st.ok(); ++p) {
        auto v = snap.find(expert_name(c, l, e, p));
        if (!v.ok()) st = v.status();
        else if (v->dtype != lay.parts[size_t(p)].dtype || v->shape != lay.parts[size_t(p)].shape)
          st = FB_ERROR(kUnsupported) << expert_name(c, l, e, p) << ": shape differs from the first expert's (one layout per store)";
        else std::memcpy(rec.data() + lay.parts[size_t(p)].offset, v->data, v->nbytes());
      }
      if (!st.ok()) break;
      crcs[i] = crc32c(rec.data(), lay.stride_bytes);
      st = write_all(fd, rec.data(), lay.stride_bytes, data_start + i * lay.stride_bytes, tmp);
      prog.done = int64_t(i + 1);
      if (progress && (i % 64 == 63 || i + 1 == total)) progress(prog);
    }
  if (st.ok()) {
    const std::vector<uint8_t> hdr = encode_header(lay, identity, n_experts, crcs, &data_start);
    st = write_all(fd, hdr.data(), hdr.size(), 0, tmp);
  }
  if (st.ok() && ::fsync(fd) != 0) st = FB_ERROR(kIo) << tmp << ": fsync: " << std::strerror(errno);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), dst.c_str()) != 0) st = FB_ERROR(kIo) << "rename " << tmp << ": " << std::strerror(errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  FB_RETURN_IF_ERROR(fsync_dir(out_dir));
  for (const std::string& r : replica_dirs) {
    std::function<void(int64_t, int64_t)> copied;
    if (progress)
      copied = [&progress, &r](int64_t done, int64_t bytes) { progress({ConvertProgress::Phase::kCopy, done, bytes, r}); };
    FB_RETURN_IF_ERROR(copy_atomic(dst, r, copied));
  }
  // Validate every copy: header on open, then every record's checksum read back from the copy.
  std::vector<std::string> all = {out_dir};
  all.insert(all.end(), replica_dirs.begin(), replica_dirs.end());
  for (const std::string& d : all) {
    auto store = FB_TRY(ExpertStore::open(d, identity));
    auto reader = FB_TRY(ReplicaReader::open({d}));
    std::function<void(int64_t, int64_t)> checked;
    if (progress)
      checked = [&progress, &d](int64_t done, int64_t n) { progress({ConvertProgress::Phase::kValidate, done, n, d}); };
    FB_RETURN_IF_ERROR(store->verify_all(*reader, checked).with_context("validating " + d));
  }
  return Status();
}

namespace {

class StoreLocator final : public ExpertLocator {
 public:
  explicit StoreLocator(std::shared_ptr<const ExpertStore> s) : s_(std::move(s)) {}
  const ExpertLayout& layout() const override { return s_->layout(); }
  int n_layers() const override { return s_->n_layers(); }
  int n_experts(int layer) const override { return s_->n_experts(layer); }
  std::vector<ReadRange> ranges(int layer, int e, uint8_t* record) const override {
    return {{kStoreFile, s_->record_offset(layer, e), s_->layout().stride_bytes, record}};
  }
  Status check(int layer, int e, const uint8_t* record) const override {
    if (crc32c(record, s_->layout().stride_bytes) != s_->record_crc(layer, e))
      return FB_ERROR(kCorrupt) << kStoreFile << ": expert " << e << " of layer " << layer << " fails its checksum";
    return Status();
  }

 private:
  std::shared_ptr<const ExpertStore> s_;
};

class ShardLocator final : public ExpertLocator {
 public:
  ExpertLayout lay;
  std::vector<int> n;
  std::vector<std::vector<std::array<loader::TensorLocation, 6>>> loc;  // [layer][expert][part], paths relative
  const ExpertLayout& layout() const override { return lay; }
  int n_layers() const override { return int(n.size()); }
  int n_experts(int layer) const override { return n[size_t(layer)]; }
  std::vector<ReadRange> ranges(int layer, int e, uint8_t* record) const override {
    std::vector<ReadRange> r;
    for (int p = 0; p < 6; ++p) {
      const loader::TensorLocation& t = loc[size_t(layer)][size_t(e)][size_t(p)];
      r.push_back({t.path, t.offset, t.nbytes, record + lay.parts[size_t(p)].offset});
    }
    return r;
  }
  Status check(int, int, const uint8_t*) const override { return Status(); }
};

}  // namespace

std::unique_ptr<ExpertLocator> store_locator(std::shared_ptr<const ExpertStore> store) {
  return std::make_unique<StoreLocator>(std::move(store));
}

Result<std::unique_ptr<ExpertLocator>> shard_locator(const loader::Snapshot& snap) {
  auto s = std::make_unique<ShardLocator>();
  s->lay = FB_TRY(expert_layout(snap));
  const model::Config& c = snap.config();
  for (int l = 0; l < c.n_total_layers(); ++l) {
    s->n.push_back(c.roles[size_t(l)].n_experts);
    s->loc.emplace_back();
    for (int e = 0; e < s->n.back(); ++e) {
      std::array<loader::TensorLocation, 6> parts;
      for (int p = 0; p < 6; ++p) {
        parts[size_t(p)] = FB_TRY(snap.locate(expert_name(c, l, e, p)));
        parts[size_t(p)].path = fs::path(parts[size_t(p)].path).lexically_relative(snap.dir()).string();
        if (parts[size_t(p)].nbytes != s->lay.parts[size_t(p)].nbytes)
          return FB_ERROR(kUnsupported) << expert_name(c, l, e, p) << ": size differs from the first expert's";
      }
      s->loc.back().push_back(parts);
    }
  }
  return std::unique_ptr<ExpertLocator>(std::move(s));
}

}  // namespace fb::storage
