#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace fb::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* expr) {
  os_ << file << ":" << line << ": FB_CHECK failed: " << expr << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace fb::detail
