// The forward pass, written ONCE: the layer order and which sublayer runs where, templated over
// the executor (CPU reference, CUDA). An executor step object provides one method per op; a
// missing op fails to compile, it never silently falls back. Numerics live in the executors;
// this file only says WHAT runs in WHICH order (spec/11 §2-§5, spec/13 §4).
#pragma once

#include "model/config.h"

namespace fb::model {

enum class Site { kAttn, kFfn };

// Backbone over the step's rows. Ex must provide the methods called below.
template <class Ex>
void run_backbone(Ex& ex, const Config& c) {
  ex.embed();         // X = 4 copies of the row embedding, pre = one-hot stream 0
  ex.engram_hash();   // row ids of both tables from token ids alone (DESIGN-AHEAD item 7)
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerRole& r = c.roles[size_t(l)];
    if (r.engram_table >= 0) ex.engram(l);           // before the block, on all streams
    if (r.dspark_tap >= 0) ex.dspark_tap(r.dspark_tap);  // stream mean of the block INPUT
    // Bounded replay (spec/11 §8.4): rows below their Row::replay_start publish the decoder's
    // global KV from their collapsed input (the source's compressor reads nothing else), then
    // leave. leave_begin(l) narrows the step to those rows (false, no change, when there are
    // none); leave_end(l) drops them and the rest of the step runs on without them.
    if (l == c.decoder_start && ex.leave_begin(l)) {
      ex.hc_collapse_norm(l, Site::kAttn);
      ex.compress(l);
      ex.leave_end(l);
    }
    // attention sublayer: mixes from the block input; collapse with the carried pre
    ex.hc_mixes(l, Site::kAttn);
    ex.hc_collapse_norm(l, Site::kAttn);
    ex.attn_q(l);        // qr = q_norm(wq_a u); q = RoPE(wq_b qr)
    ex.attn_kv(l);       // window latent: kv_norm(wkv u), RoPE, FP8 QDQ
    if (r.kv_source) ex.compress(l);        // compressor, index keys, compressed cache
    if (r.index_source) ex.index_select(l);  // indexer scores, candidate pool, top-k
    ex.attention(l);     // window + selected compressed entries, sinks
    ex.attn_output(l);   // inverse RoPE, grouped wo_a, wo_b
    ex.hc_expand(l, Site::kAttn);
    // FFN sublayer: collapses with the ATTENTION site's pre
    ex.hc_mixes(l, Site::kFfn);
    ex.hc_collapse_norm(l, Site::kFfn);
    ex.moe(l);
    ex.hc_expand(l, Site::kFfn);
    ex.end_layer(l);     // ring writes, taps
  }
  ex.head();  // final collapse with layer n-1's FFN pre, norm, logits for requested rows
}

// DSpark draft block pass (spec/13 §4): stages over the block rows, then head, Markov chain and
// confidence. Ex is a draft step object.
template <class Ex>
void run_draft(Ex& ex, const Config& c) {
  ex.embed();
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    ex.hc_mixes(l, Site::kAttn);
    ex.hc_collapse_norm(l, Site::kAttn);
    ex.attn_q(l);
    ex.attn_kv(l);
    ex.attention(l);
    ex.attn_output(l);
    ex.hc_expand(l, Site::kAttn);
    ex.hc_mixes(l, Site::kFfn);
    ex.hc_collapse_norm(l, Site::kFfn);
    ex.moe(l);
    ex.hc_expand(l, Site::kFfn);
  }
  ex.head();
  ex.markov_chain();
}

}  // namespace fb::model
