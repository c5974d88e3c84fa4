#include "fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace slimquant::fuzz {

namespace fs = std::filesystem;

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "slimquant-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

const fs::path& scratch_dir() {
  static ScratchDir dir;
  return dir.path;
}

void clear_scratch_dir() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(scratch_dir(), ec)) fs::remove_all(entry.path(), ec);
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

std::pair<std::string_view, std::optional<std::string_view>> split_parts(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t at = all.find(kPartSeparator);
  if (at == std::string_view::npos) return {all, std::nullopt};
  return {all.substr(0, at), all.substr(at + kPartSeparator.size())};
}

void internal_error_is_a_finding(const char* what) {
  std::fprintf(stderr, "fuzz: internal error (exit code 70) on hostile input: %s\n", what);
  std::abort();
}

}  // namespace slimquant::fuzz
