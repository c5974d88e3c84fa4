#include "slimquant/core/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "slimquant/core/error.h"

namespace slimquant {

namespace fs = std::filesystem;

namespace {

std::string file_type_name(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

// Refuses an existing destination that is not a regular file (after following links): renaming
// over it would replace a device node such as /dev/null (as root) or fail only after the work.
void check_replaceable(const std::string& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || st.type() == fs::file_type::not_found || st.type() == fs::file_type::regular) return;
  fail(ErrorKind::kIo, what + " '" + path + "' is " + file_type_name(st.type()) +
                           ": give the path of a file to write (it is never replaced)");
}

}  // namespace

void check_output_path(const std::string& path, const std::vector<std::string>& inputs, const std::string& what) {
  SQ_CHECK(!path.empty(), ErrorKind::kInvalidArgument, what + " is empty: give the path of a file to write");
  const fs::path out(path);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  SQ_CHECK(fs::is_directory(dir, ec), ErrorKind::kIo,
           "cannot write " + what + " '" + path + "': directory '" + dir.string() + "' does not exist");
  check_replaceable(path, what);
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    std::error_code eq;
    if (fs::equivalent(path, in, eq) && !eq)
      fail(ErrorKind::kInvalidArgument, what + " '" + path + "' is the input '" + in +
                                            "': writing it would destroy the input; give another output path");
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  check_replaceable(path, "output");
  // Unique per process and call, so concurrent writers never share a temporary.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1));
  std::FILE* raw = std::fopen(tmp.c_str(), "wb");
  if (!raw) fail(ErrorKind::kIo, "cannot write '" + path + "': " + std::strerror(errno));
  bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), raw) == bytes.size();
  const int write_errno = errno;
  ok = (std::fclose(raw) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail(ErrorKind::kIo, "failed writing '" + path + "': " + std::strerror(write_errno ? write_errno : errno));
  }
  std::error_code ec;
  // Again right before the rename: the destination may have appeared since the command started.
  try {
    check_replaceable(path, "output");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(ErrorKind::kIo, "cannot move the written file into place at '" + path + "': " + ec.message());
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace slimquant
