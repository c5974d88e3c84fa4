// The same command on the same machine, data and thread count writes the same bytes, even when
// the convolution implementation chosen by timing differs between the two runs
// (SLIMQUANT_DNNL_TUNING=0 keeps oneDNN's first choice everywhere, =alternative adopts another
// equivalent candidate wherever one exists).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "test_util.h"

using namespace slimquant;
using test::file_bytes;

namespace {

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

// Every file of a directory but measured times (*_timing.json), the lock and checkpoints.
std::map<std::string, std::string> result_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name.find("_timing.json") != std::string::npos || name.find("checkpoint") != std::string::npos ||
        name.rfind(".slimquant", 0) == 0)
      continue;
    files[name] = file_bytes(e.path().string());
  }
  return files;
}

// analyze with statistics, histogram PDFs and a target search, twice, the implementation choice
// differing between the runs: the same files, byte for byte.
TEST(AnalysisReproducibility, TheSameCommandWritesTheSameFiles) {
  test::TempDir tmp("repro_analyze");
  std::map<std::string, std::string> written[2];
  const char* tuning[2] = {"OMP_NUM_THREADS=1 SLIMQUANT_DNNL_TUNING=0", "OMP_NUM_THREADS=1 SLIMQUANT_DNNL_TUNING=alternative"};
  // One save dir (the written paths name it): each run's files are moved aside before the next.
  const std::string dir = tmp.path("analysis");
  for (int run = 0; run < 2; ++run) {
    const auto r = test::run_cli("analyze " + test::fixture_model("mobilenetv2_small") +
                                     " fashion-mnist:test --limit 200 --eval-batch-size 50 --batch-nums 2 --metric sqnr"
                                     " --num-histogram-plots 2 --statistics --target-metric 30 --save-dir " + dir,
                                 tuning[run]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    written[run] = result_files(dir);
    std::filesystem::rename(dir, tmp.path("run" + std::to_string(run)));
  }
  ASSERT_GE(written[0].size(), 5u);
  EXPECT_TRUE(written[0].count("analysis.json") && written[0].count("target_search.json") &&
              written[0].count("statistics.json"));
  for (const auto& [name, bytes] : written[0]) {
    ASSERT_TRUE(written[1].count(name)) << name;
    EXPECT_TRUE(bytes == written[1].at(name)) << name << " differs between the runs";
  }
  EXPECT_EQ(written[0].size(), written[1].size());
}

// QAT from the same model, data, seed and thread count: the same model file.
TEST(QatReproducibility, TheSameCommandWritesTheSameModel) {
  test::TempDir tmp("repro_qat");
  std::string written[2];
  const char* tuning[2] = {"OMP_NUM_THREADS=1 SLIMQUANT_DNNL_TUNING=0", "OMP_NUM_THREADS=1 SLIMQUANT_DNNL_TUNING=alternative"};
  for (int run = 0; run < 2; ++run) {
    // Names without string arithmetic: GCC 12 warns falsely (-Wstringop-overflow) on "q" + to_string(run) here.
    const std::string out = tmp.path(run == 0 ? "q0.onnx" : "q1.onnx");
    const auto r = test::run_cli("qat " + test::fixture_model("mobilenetv2_small") +
                                     " --dataset fashion-mnist:train --limit 128 --batch-size 32 --calib-batches 1 --epochs 1"
                                     " --no-eval --checkpoint " + tmp.path(run == 0 ? "ck0" : "ck1") + " -o " + out,
                                 tuning[run]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    written[run] = file_bytes(out);
  }
  ASSERT_FALSE(written[0].empty());
  EXPECT_TRUE(written[0] == written[1]);
}

}  // namespace
