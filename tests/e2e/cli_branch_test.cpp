// `quantize` and `analyze --target-metric` on a model whose layers run inside an If on a side input
// (Silero VAD's form): the branch the data takes is quantized, the other is named as float, the
// analysis ranks the branches' layers one by one, and the command the target search prints (side
// inputs and a branch's layer left float included) rebuilds its model byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <sstream>

#include "branching_model.h"
#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

using namespace slimquant;

TEST(CliBranches, QuantizeAndTheTargetSearchTakeTheBranchTheDataRuns) {
  test::TempDir tmp("cli_branches");
  test::branching_model(tmp.path("model.onnx"));
  std::filesystem::create_directories(tmp.path("calib"));
  std::mt19937 rng(4);
  write_npy(tmp.path("calib/x.npy"), test::random_tensor({96, 8}, rng));
  write_npy(tmp.path("rate.npy"), Tensor::scalar<int64_t>(16000));
  const std::string data = " npy:" + tmp.path("calib") + " --side-input rate=" + tmp.path("rate.npy") +
                           " --batch-size 16 --batch-nums 4 --algo abs_max";

  auto q = test::run_cli("quantize " + tmp.path("model.onnx") + data + " --metric sqnr --json -o " +
                                         tmp.path("q.onnx"));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("1 layers stay float in branches no calibration sample took (If 'If_rate' else_branch"),
            std::string::npos)
      << q.output;
  const auto j = test::last_json_line(q.output);
  EXPECT_EQ(j["layers"].get<int>(), 4) << q.output;  // the outer MatMul, two in one branch, one in the other
  EXPECT_NE(q.output.find("quantized 3 layers"), std::string::npos) << q.output;
  const double int8 = j["int8_sqnr"].get<double>();
  EXPECT_GT(int8, 20.0) << q.output;

  std::ostringstream target;
  target << int8 + 3.0;
  auto r = test::run_cli("analyze " + tmp.path("model.onnx") + data +
                                         " --metric sqnr --num-histogram-plots 0 --json --save-dir " + tmp.path("out") +
                                         " --target-metric " + target.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = test::last_json_line(r.output);
  ASSERT_TRUE(a.contains("target")) << r.output;
  // Every layer ranked, those inside the branches one by one; the one calibration never ran stays
  // float in its model, which is FP32's.
  const std::string ranking = test::file_bytes(tmp.path("out/analysis.txt"));
  EXPECT_NE(ranking.find("\nIf_rate/then_branch/MatMul0\tMatMul\t"), std::string::npos) << ranking;
  EXPECT_NE(ranking.find("\nMatMul2\tMatMul\t"), std::string::npos) << ranking;
  EXPECT_NE(ranking.find("\nIf_rate/else_branch/MatMul0\tMatMul\t200.000000"), std::string::npos) << ranking;
  EXPECT_NE(r.output.find("analyzed 4 layers"), std::string::npos) << r.output;
  const std::string cmd = a["target"]["command"].get<std::string>();
  EXPECT_NE(cmd.find("--side-input rate="), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--skip-nodes If_rate/then_branch/MatMul0"), std::string::npos) << cmd;  // a branch's layer
  auto again = test::run_cli(cmd.substr(std::string("slimquant ").size()) + " --no-eval");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(test::file_bytes(tmp.path("out/target_model.onnx")), test::file_bytes(tmp.path("out/target_model_requantized.onnx")));
}
