// Fuzz target: bytes as a .npy file (header only, whole array, and in-memory parsing) and as a .npz
// archive (zip directory, stored and deflated members, zip64).
#include "fuzz_util.h"
#include "slimquant/core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slimquant;
  fuzz::clear_scratch_dir();
  const auto path = fuzz::scratch_dir() / "input.npy";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean_errors([&] { read_npy_header(path.string()); });
  fuzz::expect_clean_errors([&] { read_npy(path.string()); });
  fuzz::expect_clean_errors([&] { parse_npy(data, size, "fuzz input"); });
  fuzz::expect_clean_errors([&] { read_npz(path.string()); });
  return 0;
}
