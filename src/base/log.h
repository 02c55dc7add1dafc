// Minimal leveled logging to stderr. The level is set once from Options in main().
#pragma once

#include <sstream>

namespace fb {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
void set_log_level(LogLevel level);
LogLevel log_level();

namespace detail {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace fb

#define FB_LOG(level)                                                     \
  if (::fb::LogLevel::level < ::fb::log_level()) {                        \
  } else                                                                  \
    ::fb::detail::LogLine(::fb::LogLevel::level, __FILE__, __LINE__)
