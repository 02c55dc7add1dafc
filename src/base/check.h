// FB_CHECK: broken invariants and bugs abort with file:line and a message (on in release builds).
// Input and environment errors must use Status instead (base/status.h).
#pragma once

#include <sstream>

namespace fb::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

// Lets `FB_CHECK(x) << "msg"` be a void expression in both branches of the ternary.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace fb::detail

#define FB_CHECK(cond) \
  (cond) ? (void)0 : ::fb::detail::Voidify() & ::fb::detail::CheckFailure(__FILE__, __LINE__, #cond)

#define FB_CHECK_OP(a, op, b) \
  FB_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define FB_CHECK_EQ(a, b) FB_CHECK_OP(a, ==, b)
#define FB_CHECK_NE(a, b) FB_CHECK_OP(a, !=, b)
#define FB_CHECK_LT(a, b) FB_CHECK_OP(a, <, b)
#define FB_CHECK_LE(a, b) FB_CHECK_OP(a, <=, b)
#define FB_CHECK_GE(a, b) FB_CHECK_OP(a, >=, b)
#define FB_CHECK_GT(a, b) FB_CHECK_OP(a, >, b)
