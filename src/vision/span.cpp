#include "vision/span.h"

#include <algorithm>

#include "base/check.h"

namespace fb::vision {

std::vector<int32_t> span_types(int nlh, int nlw) {
  std::vector<int32_t> t{kStart};
  for (int i = 0; i < nlh; ++i) {
    t.insert(t.end(), size_t(nlw), kImage);
    t.push_back(kNewline);
  }
  t.push_back(kEnd);
  return t;
}

std::vector<uint16_t> span_markers(const model::VisionWeights& w, int dim) {
  std::vector<uint16_t> m(3 * size_t(dim));
  std::copy_n(w.image_start.as<uint16_t>(), dim, &m[0]);
  std::copy_n(w.image_newline.as<uint16_t>(), dim, &m[size_t(dim)]);
  std::copy_n(w.image_end.as<uint16_t>(), dim, &m[2 * size_t(dim)]);
  return m;
}

std::vector<uint16_t> span_embeddings(const std::vector<int32_t>& types, const std::vector<uint16_t>& aligned,
                                      const std::vector<uint16_t>& markers, int dim) {
  FB_CHECK_EQ(markers.size(), 3 * size_t(dim));
  std::vector<uint16_t> e(types.size() * size_t(dim));
  size_t k = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    const uint16_t* src = nullptr;
    switch (types[i]) {
      case kStart: src = &markers[0]; break;
      case kNewline: src = &markers[size_t(dim)]; break;
      case kEnd: src = &markers[2 * size_t(dim)]; break;
      case kImage:
        FB_CHECK((k + 1) * size_t(dim) <= aligned.size()) << "more IMAGE slots than aligner rows";
        src = &aligned[k++ * size_t(dim)];
        break;
      default: FB_CHECK(false) << "span type " << types[i];
    }
    std::copy_n(src, dim, &e[i * size_t(dim)]);
  }
  FB_CHECK_EQ(k * size_t(dim), aligned.size());
  return e;
}

std::vector<uint16_t> span_embeddings(const std::vector<int32_t>& types, const std::vector<uint16_t>& aligned,
                                      const model::VisionWeights& w, int dim) {
  return span_embeddings(types, aligned, span_markers(w, dim), dim);
}

void append_span_rows(model::Step& step, int session, int64_t pos0, const std::vector<int32_t>& types,
                      const std::vector<uint16_t>& embeddings, int dim, int32_t image_token_id, int64_t prefill_end) {
  FB_CHECK_EQ(embeddings.size(), types.size() * size_t(dim));
  const int32_t first = int32_t(step.embeddings.size() / size_t(dim));
  step.embeddings.insert(step.embeddings.end(), embeddings.begin(), embeddings.end());
  for (size_t i = 0; i < types.size(); ++i) {
    model::Row r;
    r.session = session;
    r.pos = pos0 + int64_t(i);
    r.token = image_token_id;
    r.kind = model::RowKind::kPrefill;
    r.prefill_end = prefill_end;
    r.image = true;
    r.embed_row = first + int32_t(i);
    step.rows.push_back(r);
  }
}

}  // namespace fb::vision
