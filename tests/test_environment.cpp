// Linked into every test binary: the environment every test starts from.
#include <cstdlib>

namespace {

// Kernel choices stay in memory (SLIMQUANT_TUNING_CACHE=0) unless the caller asks for a file: a
// test must not read choices an earlier run left in the user's cache, nor leave its own there. The
// CLI processes tests start inherit it.
[[maybe_unused]] const bool kHermeticTuning = [] { return ::setenv("SLIMQUANT_TUNING_CACHE", "0", /*overwrite=*/0) == 0; }();
// Likewise calibration checkpoints (PostTrainingQuantization::calibration_checkpoint): none in the
// user's cache unless a test sets a folder.
[[maybe_unused]] const bool kHermeticCalibration = [] {
  return ::setenv("SLIMQUANT_CALIBRATION_CACHE", "0", /*overwrite=*/0) == 0;
}();

}  // namespace
