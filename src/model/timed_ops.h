// TimedOps<Ex>: an executor step object for run_backbone (model/forward.h) that forwards every op
// to `Ex` with a steady_clock reading around it and adds the time to the op's family (issue 24's
// step time by op family). It changes no numerics and no order. Host clock only: it measures an
// op's whole cost where the op computes while it is called (the CPU executor); a backend that
// only enqueues (CUDA) would measure its launch time, so it keeps its own event profiler instead.
// Cost: two clock reads per op, ~14 ops per layer (docs/serving.md has the measured share).
#pragma once

#include <chrono>

#include "model/executor_stats.h"
#include "model/forward.h"

namespace fb::model {

template <class Ex>
class TimedOps {
 public:
  TimedOps(Ex& ex, OpTimes& t) : ex_(ex), t_(t) {}

  void embed() { time<op_family("embed")>([&] { ex_.embed(); }); }
  void engram_hash() { time<op_family("engram_hash")>([&] { ex_.engram_hash(); }); }
  void engram(int l) { time<op_family("engram")>([&] { ex_.engram(l); }); }
  void dspark_tap(int i) { time<op_family("dspark_tap")>([&] { ex_.dspark_tap(i); }); }
  bool leave_begin(int l) {
    bool r = false;
    time<op_family("leave_begin")>([&] { r = ex_.leave_begin(l); });
    return r;
  }
  void leave_end(int l) { time<op_family("leave_end")>([&] { ex_.leave_end(l); }); }
  void hc_mixes(int l, Site s) { time<op_family("hc_mixes")>([&] { ex_.hc_mixes(l, s); }); }
  void hc_collapse_norm(int l, Site s) { time<op_family("hc_collapse_norm")>([&] { ex_.hc_collapse_norm(l, s); }); }
  void hc_expand(int l, Site s) { time<op_family("hc_expand")>([&] { ex_.hc_expand(l, s); }); }
  void attn_q(int l) { time<op_family("attn_q")>([&] { ex_.attn_q(l); }); }
  void attn_kv(int l) { time<op_family("attn_kv")>([&] { ex_.attn_kv(l); }); }
  void attn_output(int l) { time<op_family("attn_output")>([&] { ex_.attn_output(l); }); }
  void compress(int l) { time<op_family("compress")>([&] { ex_.compress(l); }); }
  void index_select(int l) { time<op_family("index_select")>([&] { ex_.index_select(l); }); }
  void attention(int l) { time<op_family("attention")>([&] { ex_.attention(l); }); }
  void moe(int l) { time<op_family("moe")>([&] { ex_.moe(l); }); }
  void end_layer(int l) { time<op_family("end_layer")>([&] { ex_.end_layer(l); }); }
  void head() { time<op_family("head")>([&] { ex_.head(); }); }

 private:
  template <OpFamily f, class F>
  void time(F&& op) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    t_.s[size_t(f)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t_.calls[size_t(f)];
  }
  Ex& ex_;
  OpTimes& t_;
};

// run_backbone with every op timed into `t` (one more step counted).
template <class Ex>
void run_backbone_timed(Ex& ex, const Config& c, OpTimes& t) {
  TimedOps<Ex> timed(ex, t);
  run_backbone(timed, c);
  ++t.steps;
}

}  // namespace fb::model
