// Errors as values: every public call that can fail returns Status or Result<T>.
// Nothing in the runtime throws across the API or aborts on bad input.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace switchboard {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something malformed
  kInvalidProgram,   // the program file failed verification or validation
  kInvalidWeights,   // the weights file is malformed or disagrees with the program
  kNotFound,         // a named input, output, constant or file is missing
  kOutOfRange,       // an index or size is outside what is allowed
  kUnimplemented,    // a device lacks a kernel
  kIoError,          // the operating system refused a file operation
  kInternal,         // a broken invariant inside Switchboard (a bug)
  kFailedPrecondition,  // the device cannot meet the numerics contract (exact mode refused)
  kResourceExhausted,   // a device allocation or limit ran out
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidProgram: chains[2].instructions[7]...: ..."
  std::string to_string() const;

  // Prefixes the message with a path element: annotate("chains[2]") on
  // "instructions[7]: bad" gives "chains[2].instructions[7]: bad".
  Status annotate(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result built from an OK status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

// printf-style message builder, so error sites stay one line.
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

template <class A0, class... A>
Status make_error(StatusCode code, const char* fmt, A0 arg0, A... args) {
  return Status(code, strformat(fmt, arg0, args...));
}
inline Status make_error(StatusCode code, const char* message) { return Status(code, message); }

}  // namespace switchboard

#define SB_CONCAT_INNER(a, b) a##b
#define SB_CONCAT(a, b) SB_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is an error.
#define SB_RETURN_IF_ERROR(expr)                          \
  do {                                                    \
    ::switchboard::Status sb_status_ = (expr);            \
    if (!sb_status_.is_ok()) return sb_status_;           \
  } while (0)

// Like SB_RETURN_IF_ERROR, and prefixes the message with a path element.
#define SB_RETURN_IF_ERROR_AT(expr, path)                 \
  do {                                                    \
    ::switchboard::Status sb_status_ = (expr);            \
    if (!sb_status_.is_ok()) return sb_status_.annotate(path); \
  } while (0)

#define SB_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

// `SB_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define SB_ASSIGN_OR_RETURN(lhs, expr) SB_ASSIGN_OR_RETURN_IMPL(SB_CONCAT(sb_result_, __LINE__), lhs, expr)

// Returns an error Status when `cond` is false.
#define SB_CHECK_OR_RETURN(cond, code, ...)                          \
  do {                                                               \
    if (!(cond)) return ::switchboard::make_error(code, __VA_ARGS__); \
  } while (0)
