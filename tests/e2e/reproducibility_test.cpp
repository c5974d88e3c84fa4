// The same command on the same machine, data and thread count writes the same bytes, even when
// the convolution implementation chosen by timing differs between the two runs
// (SLIMQUANT_DNNL_TUNING=0 keeps oneDNN's first choice everywhere, =alternative adopts another
// equivalent candidate wherever one exists).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "test_util.h"

using namespace slimquant;

namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const char* const kCalibration = " --dataset fashion-mnist:train --limit 96 --batch-size 32 --no-eval --threads 1 ";

class QuantizeReproducibility : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeReproducibility, WritesTheSameBytesWhateverImplementationTheTimingPicks) {
  test::TempDir tmp("repro");
  const std::string model = test::fixture_model(GetParam());
  // The default algorithm and a histogram one (bin edges are where last-bit differences would show).
  for (const std::string algo : {"emd", "KL"}) {
    std::string written[3];
    const char* tuning[3] = {"SLIMQUANT_DNNL_TUNING=0", "SLIMQUANT_DNNL_TUNING=alternative", ""};
    for (int run = 0; run < 3; ++run) {
      const std::string out = tmp.path(algo + std::to_string(run) + ".onnx");
      const auto r = test::run_cli("quantize " + model + kCalibration + "--algo " + algo + " -o " + out, tuning[run]);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      written[run] = file_bytes(out);
      ASSERT_FALSE(written[run].empty());
    }
    EXPECT_TRUE(written[0] == written[1]) << GetParam() << " " << algo << ": first choice vs alternative";
    EXPECT_TRUE(written[0] == written[2]) << GetParam() << " " << algo << ": first choice vs timed";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeReproducibility,
                         ::testing::Values("resnet_small", "mobilenetv2_small", "vit_small"));

}  // namespace
