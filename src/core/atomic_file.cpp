#include "slimquant/core/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slimquant/core/error.h"

namespace slimquant {

void write_file_atomic(const std::string& path, std::string_view bytes) {
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
