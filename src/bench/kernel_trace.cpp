#include "bench/kernel_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include <cuda_runtime.h>

#ifdef FB_HAVE_CUPTI
#include <cupti.h>
#endif

namespace fb::bench {

Status write_trace_csv(const std::string& path, const std::vector<TraceRecord>& recs) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return FB_ERROR(kIo) << "cannot write " << path;
  std::fprintf(f, "name,stream,start_us,end_us,grid,kernel\n");
  uint64_t t0 = UINT64_MAX;
  for (const TraceRecord& r : recs) t0 = std::min(t0, r.start_ns);
  for (const TraceRecord& r : recs)
    std::fprintf(f, "\"%s\",%u,%.3f,%.3f,%u,%d\n", r.name.c_str(), r.stream, double(r.start_ns - t0) * 1e-3, double(r.end_ns - t0) * 1e-3, r.grid,
                 int(r.kernel));
  if (std::fclose(f) != 0) return FB_ERROR(kIo) << "cannot write " << path;
  return Status();
}

std::string short_kernel_name(const std::string& name) {
  std::string s = name;
  if (s.rfind("_Z", 0) == 0) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status), std::free);
    if (status == 0 && d) s = d.get();
  }
  for (const std::string& p : {std::string("(anonymous namespace)::"), std::string("fb::cuda::"), std::string("fb::")}) {
    for (size_t at; (at = s.find(p)) != std::string::npos;) s.erase(at, p.size());
  }
  // The argument list starts at the first '(' outside template arguments (argument types may hold
  // parentheses of their own: function pointers, casts in template arguments).
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') {
      ++depth;
    } else if (s[i] == '>') {
      --depth;
    } else if (s[i] == '(' && depth == 0 && i > 0) {
      s.resize(i);
      break;
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  return s;
}

TraceSummary summarize(const std::vector<TraceRecord>& recs) {
  TraceSummary t;
  if (recs.empty()) return t;
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> by_stream;
  std::map<uint32_t, int64_t> kernels_on;
  for (const TraceRecord& r : recs) {
    iv.push_back({r.start_ns, std::max(r.start_ns, r.end_ns)});
    by_stream[r.stream].push_back(iv.back());
    if (r.kernel) {
      ++t.kernels;
      ++kernels_on[r.stream];
      t.kernel_us += double(iv.back().second - iv.back().first) * 1e-3;
    } else {
      ++t.copies;
    }
  }
  std::sort(iv.begin(), iv.end());
  uint64_t busy = 0, cur_s = iv[0].first, cur_e = iv[0].second, last = iv[0].second;
  for (size_t i = 1; i < iv.size(); ++i) {
    last = std::max(last, iv[i].second);
    if (iv[i].first > cur_e) {
      busy += cur_e - cur_s;
      cur_s = iv[i].first;
      cur_e = iv[i].second;
    } else {
      cur_e = std::max(cur_e, iv[i].second);
    }
  }
  busy += cur_e - cur_s;
  t.span_us = double(last - iv[0].first) * 1e-3;
  t.busy_us = double(busy) * 1e-3;
  t.idle_us = t.span_us - t.busy_us;
  uint32_t main = 0;
  int64_t most = -1;
  for (const auto& [s, n] : kernels_on)
    if (n > most) {
      most = n;
      main = s;
    }
  auto& m = by_stream[main];
  std::sort(m.begin(), m.end());
  for (size_t i = 1; i < m.size(); ++i) {
    const double gap = (double(m[i].first) - double(m[i - 1].second)) * 1e-3;
    if (gap > 0) t.main_gap_us += gap;
    else t.main_overlap_us -= gap;
  }
  return t;
}

namespace {

// Sorted, disjoint union of [start, end) intervals.
std::vector<std::pair<uint64_t, uint64_t>> union_of(std::vector<std::pair<uint64_t, uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& x : iv) {
    if (x.second <= x.first) continue;
    if (!out.empty() && x.first <= out.back().second) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

uint64_t length(const std::vector<std::pair<uint64_t, uint64_t>>& u) {
  uint64_t n = 0;
  for (const auto& x : u) n += x.second - x.first;
  return n;
}

}  // namespace

CopyOverlap copy_overlap(const std::vector<TraceRecord>& recs) {
  CopyOverlap o;
  if (recs.empty()) return o;
  std::vector<std::pair<uint64_t, uint64_t>> k, c, all;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const TraceRecord& r : recs) {
    const std::pair<uint64_t, uint64_t> x{r.start_ns, std::max(r.start_ns, r.end_ns)};
    lo = std::min(lo, x.first);
    hi = std::max(hi, x.second);
    if (r.kernel) k.push_back(x);
    else if (r.name == "memcpy HtoD") c.push_back(x);
    else continue;
    all.push_back(x);
  }
  const auto ku = union_of(std::move(k)), cu = union_of(std::move(c)), au = union_of(std::move(all));
  // |K n C| = |K| + |C| - |K u C|
  const uint64_t kl = length(ku), cl = length(cu), al = length(au), both = kl + cl - al;
  o.span_us = double(hi - lo) * 1e-3;
  o.kernel_us = double(kl) * 1e-3;
  o.copy_us = double(cl) * 1e-3;
  o.both_us = double(both) * 1e-3;
  o.copy_only_us = double(cl - both) * 1e-3;
  o.kernel_only_us = double(kl - both) * 1e-3;
  o.idle_us = double(hi - lo - al) * 1e-3;
  return o;
}

std::vector<TraceRecord> records_after(const std::vector<TraceRecord>& recs, const std::string& name, int n, uint64_t* boundary_end_ns) {
  *boundary_end_ns = 0;
  int seen = 0;
  for (size_t i = 0; i < recs.size(); ++i)
    if (recs[i].name == name && ++seen == n) {
      *boundary_end_ns = recs[i].end_ns;
      return std::vector<TraceRecord>(recs.begin() + std::ptrdiff_t(i) + 1, recs.end());
    }
  return recs;
}

#ifdef FB_HAVE_CUPTI

namespace {

std::mutex g_mu;
std::vector<TraceRecord>* g_sink = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lk(g_mu);
  CUpti_Activity* rec = nullptr;
  while (buffer && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (!g_sink) continue;
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      TraceRecord r;
      r.name = short_kernel_name(k->name ? k->name : "?");
      r.stream = k->streamId;
      r.start_ns = k->start;
      r.end_ns = k->end;
      r.grid = uint32_t(int64_t(k->gridX) * k->gridY * k->gridZ);
      g_sink->push_back(std::move(r));
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      TraceRecord r;
      const char* kind = c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                         : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                         : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                          : "other";
      r.name = std::string("memcpy ") + kind;
      r.stream = c->streamId;
      r.start_ns = c->start;
      r.end_ns = c->end;
      r.kernel = false;
      g_sink->push_back(std::move(r));
    }
  }
  std::free(buffer);
}

Status cupti_status(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return Status();
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  return FB_ERROR(kInternal) << "CUPTI " << what << ": " << (msg ? msg : "?");
}

}  // namespace

bool kernel_trace_available() { return true; }

Result<std::unique_ptr<KernelTracer>> KernelTracer::start() {
  static const Status registered = cupti_status(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
  FB_RETURN_IF_ERROR(registered);
  FB_RETURN_IF_ERROR(cupti_status(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels"));
  if (Status st = cupti_status(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copies"); !st.ok()) {
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    return st;
  }
  return std::unique_ptr<KernelTracer>(new KernelTracer());
}

KernelTracer::~KernelTracer() {
  cudaDeviceSynchronize();
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityFlushAll(1);  // (no sink: dropped)
}

Result<std::vector<TraceRecord>> KernelTracer::capture(const std::function<Status()>& work) {
  cudaDeviceSynchronize();
  FB_RETURN_IF_ERROR(cupti_status(cuptiActivityFlushAll(1), "flush"));  // earlier work's records, dropped
  std::vector<TraceRecord> out;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_sink = &out;
  }
  Status st = work();
  cudaDeviceSynchronize();
  const Status flushed = cupti_status(cuptiActivityFlushAll(1), "flush");
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_sink = nullptr;
  }
  FB_RETURN_IF_ERROR(st);
  FB_RETURN_IF_ERROR(flushed);
  std::sort(out.begin(), out.end(), [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

#else

bool kernel_trace_available() { return false; }

Result<std::unique_ptr<KernelTracer>> KernelTracer::start() {
  return FB_ERROR(kUnsupported) << "this build has no CUPTI (kernel traces need the CUDA toolkit's CUPTI)";
}
KernelTracer::~KernelTracer() = default;
Result<std::vector<TraceRecord>> KernelTracer::capture(const std::function<Status()>&) {
  return FB_ERROR(kUnsupported) << "this build has no CUPTI";
}

#endif

}  // namespace fb::bench
