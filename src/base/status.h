// Status and Result<T>: how environment and input errors travel (missing file, bad checkpoint,
// device OOM, bad client JSON). Bugs use FB_CHECK instead. No exceptions cross our code.
#pragma once

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace fb {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad user input (flags, request fields, config values)
  kNotFound,         // missing file or tensor
  kCorrupt,          // a file that does not follow its format
  kUnsupported,      // valid but not handled by this build
  kOutOfMemory,      // an allocation the caller may retry smaller
  kIo,               // read/write failed
  kResourceExhausted,// context overflow, queue full
  kCancelled,
  kInternal,
  kUnavailable,      // busy right now (request queue full): retry later (HTTP 429)
};

const char* status_code_name(StatusCode c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;
  // Prefix context ("reading shard X: ...") while keeping the code.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds a message from stream pieces: FB_ERROR(kCorrupt) << "shard " << name << " is short".
class StatusBuilder {
 public:
  explicit StatusBuilder(StatusCode code) : code_(code) {}
  template <typename T>
  StatusBuilder& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  operator Status() const { return Status(code_, os_.str()); }  // NOLINT: implicit by design

 private:
  StatusCode code_;
  std::ostringstream os_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {   // NOLINT: implicit by design
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result built from an OK status");
  }
  Result(const StatusBuilder& b) : Result(Status(b)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace fb

#define FB_ERROR(code) ::fb::StatusBuilder(::fb::StatusCode::code)

#define FB_CONCAT_INNER(a, b) a##b
#define FB_CONCAT(a, b) FB_CONCAT_INNER(a, b)

// Propagate a failed Status.
#define FB_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::fb::Status fb_status_ = (expr);         \
    if (!fb_status_.ok()) return fb_status_;  \
  } while (0)

// auto x = FB_TRY(expression returning Result<T>);  (GNU statement expression)
#define FB_TRY(expr)                                            \
  ({                                                            \
    auto fb_result_ = (expr);                                   \
    if (!fb_result_.ok()) return fb_result_.status();           \
    std::move(fb_result_).value();                              \
  })
