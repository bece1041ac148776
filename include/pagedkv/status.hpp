// Status and StatusOr<T>: the error model of every public pagedkv call.
//
// Codes are chosen by meaning (as in abseil). No exception crosses the public API: every
// fallible call returns a Status or a StatusOr<T>, and a failed call has no effect.
#pragma once

#include <cassert>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

namespace pagedkv {

/// Error codes by meaning, not by origin.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed (null pointer, bad shape)
  kNotFound,            // an id that does not exist (unknown sequence)
  kAlreadyExists,       // an id that exists already (duplicate sequence)
  kOutOfRange,          // an index past a bound (layer, head, position, slot)
  kFailedPrecondition,  // the call is valid but not now (commit before reserve)
  kResourceExhausted,   // out of blocks, out of memory
  kUnavailable,         // the backend or device is not present
  kUnimplemented,       // the operation is not supported by this build or backend
  kInternal,            // a broken invariant or a backend (CUDA) failure
};

/// The name of a code, e.g. "kInvalidArgument".
const char* status_code_name(StatusCode code);

/// A success or an error code with a message. Cheap to copy on success.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  /// "kOk" or "kNotFound: sequence 7 does not exist".
  std::string to_string() const;

  /// Explicitly drops the status; for places where an error is knowingly ignored.
  void ignore_error() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status already_exists(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
inline Status out_of_range(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
inline Status failed_precondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status resource_exhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

/// A value of type T, or the Status saying why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
  static_assert(!std::is_same<std::decay_t<T>, Status>::value, "StatusOr<Status> is not allowed");

 public:
  /// An error; constructing from an ok Status is a programming error and becomes kInternal.
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (status_.ok()) status_ = internal_error("StatusOr constructed from an ok Status");
  }
  StatusOr(const T& value) : has_value_(true) { new (&storage_) T(value); }        // NOLINT
  StatusOr(T&& value) : has_value_(true) { new (&storage_) T(std::move(value)); }  // NOLINT

  StatusOr(const StatusOr& other) : status_(other.status_), has_value_(other.has_value_) {
    if (has_value_) new (&storage_) T(*other.ptr());
  }
  StatusOr(StatusOr&& other) noexcept(std::is_nothrow_move_constructible<T>::value)
      : status_(std::move(other.status_)), has_value_(other.has_value_) {
    if (has_value_) new (&storage_) T(std::move(*other.ptr()));
  }
  StatusOr& operator=(StatusOr other) {
    reset();
    status_ = std::move(other.status_);
    has_value_ = other.has_value_;
    if (has_value_) new (&storage_) T(std::move(*other.ptr()));
    return *this;
  }
  ~StatusOr() { reset(); }

  bool ok() const { return has_value_; }
  /// The error, or an ok Status when a value is held.
  const Status& status() const { return status_; }

  /// Access the value. Calling these without a value is a programming error (asserts).
  T& value() & {
    assert(has_value_ && "StatusOr::value() without a value");
    return *ptr();
  }
  const T& value() const& {
    assert(has_value_ && "StatusOr::value() without a value");
    return *ptr();
  }
  T&& value() && {
    assert(has_value_ && "StatusOr::value() without a value");
    return std::move(*ptr());
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The value, or `fallback` when there is none.
  T value_or(T fallback) const& { return has_value_ ? *ptr() : std::move(fallback); }

 private:
  T* ptr() { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const { return std::launder(reinterpret_cast<const T*>(&storage_)); }
  void reset() {
    if (has_value_) ptr()->~T();
    has_value_ = false;
  }

  Status status_;
  bool has_value_ = false;
  std::aligned_storage_t<sizeof(T), alignof(T)> storage_;
};

}  // namespace pagedkv

#define PAGEDKV_CONCAT_INNER_(a, b) a##b
#define PAGEDKV_CONCAT_(a, b) PAGEDKV_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` from the enclosing function when it is not ok.
#define PAGEDKV_RETURN_IF_ERROR(expr)                          \
  do {                                                         \
    ::pagedkv::Status pagedkv_status_tmp_ = (expr);            \
    if (!pagedkv_status_tmp_.ok()) return pagedkv_status_tmp_; \
  } while (0)

/// `PAGEDKV_ASSIGN_OR_RETURN(auto x, f())`: binds the value or returns the error.
#define PAGEDKV_ASSIGN_OR_RETURN(lhs, expr) \
  PAGEDKV_ASSIGN_OR_RETURN_IMPL_(PAGEDKV_CONCAT_(pagedkv_statusor_, __LINE__), lhs, expr)
#define PAGEDKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
