// Replays fuzz inputs through a target without libFuzzer: every file under each argument (a file
// or a folder, sorted by name) goes through LLVMFuzzerTestOneInput once. A crash, sanitizer report
// or escaping exception ends the process, so ctest fails naming the input printed last.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Defined by the AddressSanitizer runtime, when the process has one.
extern "C" int __asan_address_is_poisoned(void const volatile* address) __attribute__((weak));

static bool running_under_address_sanitizer() { return __asan_address_is_poisoned != nullptr; }

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  // The fuzzers' memory limit (-rss_limit_mb=2048): an input that makes the code allocate
  // gigabytes before checking sizes fails here too (bad_alloc, or an internal error) instead of
  // passing on a machine with enough memory.
  // Not under AddressSanitizer, whose shadow memory is terabytes of private mappings that
  // RLIMIT_DATA counts (every process would fail to start); the normal build keeps the limit. Asked
  // at run time: the sanitized run links this file's normal object with the ASan runtime.
  if (!running_under_address_sanitizer()) {
    const rlimit data_limit{rlim_t{2} << 30, rlim_t{2} << 30};
    setrlimit(RLIMIT_DATA, &data_limit);
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg))
        if (entry.is_regular_file() && entry.path().filename().string().front() != '.') inputs.push_back(entry.path());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    }  // a missing folder holds no regressions yet
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& path : inputs) {
    std::fprintf(stderr, "replaying %s\n", path.c_str());
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu input(s)\n", inputs.size());
  return 0;
}
