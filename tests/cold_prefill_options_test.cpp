// `bench --cold-prefill-routing` (bench/cold_prefill.h parse_route_share): the named choices, a
// share strictly between 0 and 1, and an error naming the choices otherwise. No device needed.
#include "bench/cold_prefill.h"

#include <gtest/gtest.h>

namespace fb::bench {
namespace {

TEST(ColdPrefillOptions, RouteShare) {
  EXPECT_EQ(*parse_route_share("uniform"), 0.0);
  EXPECT_EQ(*parse_route_share("router"), -1.0);
  EXPECT_DOUBLE_EQ(*parse_route_share("0.45"), 0.45);
  for (const char* bad : {"", "0", "1", "1.5", "-0.2", "0.4x", "Uniform", "nan"}) {
    const auto r = parse_route_share(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().to_string().find("uniform, router or a share"), std::string::npos) << r.status().to_string();
  }
}

}  // namespace
}  // namespace fb::bench
