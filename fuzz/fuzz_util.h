#pragma once
// Shared helpers of the fuzz targets (fuzz/fuzz_*.cpp). Each target defines LLVMFuzzerTestOneInput;
// it is linked with libFuzzer in the clang build (-DSLIMQUANT_FUZZ=ON) and with replay_main.cpp in
// the normal build, where ctest replays fuzz/regressions/<target>/ through it.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>

namespace slimquant::fuzz {

// Separates the parts of a multi-file input (model + external data, list + image). Rare enough
// that mutations do not create it by chance, short enough that the fuzzer can insert it.
inline constexpr std::string_view kPartSeparator = "\n--SQFUZZ-PART--\n";

// A scratch folder for this process (created on first use, removed at exit); targets write their
// input there because the code under test reads files by path.
const std::filesystem::path& scratch_dir();

// Empties the scratch folder, so that no file of a previous input is seen by the next.
void clear_scratch_dir();

void write_file(const std::filesystem::path& path, std::string_view bytes);

// The input up to the first separator, and what follows it (nullopt when there is none).
std::pair<std::string_view, std::optional<std::string_view>> split_parts(const uint8_t* data, size_t size);

// Runs `body`. A slimquant::Error is how hostile input must end, except ErrorKind::kInternal (exit
// code 70: a bug, not a verdict on the input), which aborts like any other escaping exception so
// that the fuzzer records the input.
template <class Body>
void expect_clean_errors(Body&& body);

[[noreturn]] void internal_error_is_a_finding(const char* what);

}  // namespace slimquant::fuzz

#include "slimquant/core/error.h"

template <class Body>
void slimquant::fuzz::expect_clean_errors(Body&& body) {
  try {
    body();
  } catch (const slimquant::Error& e) {
    if (e.kind() == slimquant::ErrorKind::kInternal) internal_error_is_a_finding(e.what());
  }
}
