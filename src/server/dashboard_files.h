// The dashboard's static files (src/server/dashboard/ and, when Debian's libjs-chart.js was
// installed at configure time, its chart.min.js), embedded in the binary by a build step
// (embed_dashboard.cmake). Each file's bytes are followed by a NUL that `size` does not count.
#pragma once

#include <cstddef>

namespace fb::server {

struct EmbeddedFile {
  const char* url;           // "/", "/dashboard/dashboard.js", ...
  const char* content_type;
  const unsigned char* data;
  size_t size;
};

extern const EmbeddedFile kDashboardFiles[];
extern const size_t kDashboardFileCount;
extern const bool kDashboardHasChartJs;  // /dashboard/chart.js is Chart.js (else the page draws its own charts)

}  // namespace fb::server
