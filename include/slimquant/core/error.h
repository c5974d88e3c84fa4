#pragma once
// Errors: one exception type carrying a message that names the offending thing and the rule it
// broke. Library code throws; the CLI catches at the boundary and turns it into an exit code.
#include <stdexcept>
#include <string>

namespace slimquant {

enum class ErrorKind {
  kInvalidModel,     // truncated / non-ONNX file, malformed graph
  kUnsupported,      // op or dtype the runtime does not implement
  kInvalidArgument,  // wrong input name, shape, dtype, bad flag value
  kInvalidData,      // NaN/Inf, empty data set, unreadable sample
  kIo,               // missing file/directory, unwritable output
  kInternal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace slimquant

#define SQ_CHECK(cond, kind, msg)                         \
  do {                                                    \
    if (!(cond)) ::slimquant::fail((kind), (msg));        \
  } while (0)
