#include "base/log.h"

#include <atomic>
#include <cstdio>

namespace fb {

namespace {
std::atomic<int> g_level{int(LogLevel::kInfo)};  // process-wide sink setting, set from main()
}

void set_log_level(LogLevel level) { g_level.store(int(level)); }
LogLevel log_level() { return LogLevel(g_level.load()); }

namespace detail {
LogLine::LogLine(LogLevel level, const char*, int) : level_(level) {
  static const char* kTag[] = {"debug", "info", "warn", "error", ""};
  os_ << "[" << kTag[int(level)] << "] ";
}
LogLine::~LogLine() {
  os_ << "\n";
  std::fputs(os_.str().c_str(), stderr);
}
}  // namespace detail

}  // namespace fb
