#include "storage/record_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "storage/aligned_buffer.h"

namespace fb::storage {

namespace {

class CyclicLocator final : public ExpertLocator {
 public:
  CyclicLocator(const ExpertLayout& lay, std::vector<int> n_experts, int n_records, std::string file)
      : lay_(lay), n_experts_(std::move(n_experts)), n_records_(n_records), file_(std::move(file)) {}
  const ExpertLayout& layout() const override { return lay_; }
  int n_layers() const override { return int(n_experts_.size()); }
  int n_experts(int layer) const override { return n_experts_[size_t(layer)]; }
  std::vector<ReadRange> ranges(int layer, int e, uint8_t* record) const override {
    return {{file_, uint64_t(cyclic_record(layer, e, n_records_)) * lay_.stride_bytes, lay_.stride_bytes, record}};
  }
  Status check(int, int, const uint8_t*) const override { return Status(); }

 private:
  ExpertLayout lay_;
  std::vector<int> n_experts_;
  int n_records_;
  std::string file_;
};

}  // namespace

int cyclic_record(int layer, int e, int n_records) { return int((int64_t(layer) * 131 + e) % n_records); }

Status write_record_file(const std::string& path, const ExpertLayout& lay, int n_records,
                         const std::function<model::ExpertWeights(int r)>& record) {
  if (n_records < 1) return FB_ERROR(kInvalidArgument) << "a record file needs at least one record";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FB_ERROR(kIo) << path << ": " << std::strerror(errno);
  AlignedBuffer rec(lay.stride_bytes);
  Status st;
  for (int r = 0; r < n_records && st.ok(); ++r) {
    std::memset(rec.data(), 0, rec.size());
    const model::ExpertWeights w = record(r);
    const TensorView* parts[6] = {&w.w1.w, &w.w1.scale, &w.w3.w, &w.w3.scale, &w.w2.w, &w.w2.scale};
    for (int p = 0; p < 6 && st.ok(); ++p) {
      if (uint64_t(parts[p]->nbytes()) != lay.parts[size_t(p)].nbytes) {
        st = FB_ERROR(kInvalidArgument) << "record " << r << " part " << p << ": " << parts[p]->nbytes() << " bytes, the layout has "
                                        << lay.parts[size_t(p)].nbytes;
        break;
      }
      std::memcpy(rec.data() + lay.parts[size_t(p)].offset, parts[p]->data, size_t(parts[p]->nbytes()));
    }
    for (uint64_t done = 0; st.ok() && done < lay.stride_bytes;) {
      const ssize_t n = ::pwrite(fd, rec.data() + done, lay.stride_bytes - done, off_t(uint64_t(r) * lay.stride_bytes + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) st = FB_ERROR(kIo) << path << ": " << std::strerror(errno);
      else done += uint64_t(n);
    }
  }
  if (st.ok() && ::fsync(fd) != 0) st = FB_ERROR(kIo) << path << ": fsync: " << std::strerror(errno);
  ::close(fd);
  return st;
}

std::unique_ptr<ExpertLocator> cyclic_locator(const ExpertLayout& lay, std::vector<int> n_experts, int n_records, std::string file) {
  return std::make_unique<CyclicLocator>(lay, std::move(n_experts), n_records, std::move(file));
}

}  // namespace fb::storage
