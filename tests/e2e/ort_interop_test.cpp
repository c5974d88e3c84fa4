// Our QDQ export loads in ONNX Runtime and gives the same top-1 as our own execution.
// Skips only when Node.js or onnxruntime-node is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "slimquant/analysis/evaluate.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/ptq.h"
#include "quant/int8_test_util.h"
#include "test_util.h"

using namespace slimquant;

namespace {

bool have_ort() {
  return std::system("command -v node >/dev/null 2>&1") == 0 &&
         std::filesystem::exists(test::source_path("bench/node_modules/onnxruntime-node/package.json"));
}

double ort_top1(const std::string& model) {
  std::string cmd = "NODE_PATH=" + test::source_path("bench/node_modules") + " node " +
                    test::source_path("bench/ort_eval.js") + " " + model + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1))["top1"].get<double>();
}

TEST(OrtInterop, QdqModelTop1MatchesOnnxRuntime) {
  if (!have_ort()) GTEST_SKIP() << "Node.js / onnxruntime-node not installed";
  test::TempDir tmp("ort");
  ir::Graph qdq = test::calibrated_qdq("resnet_small", 320);
  const std::string path = tmp.path("resnet_small.int8.onnx");
  ir::save_onnx(qdq, path);

  data::DataOptions test_opts;
  test_opts.spec = "fashion-mnist:test";
  auto test_set = data::open_dataset(test_opts);
  runtime::Session ours = quant::make_int8_session(ir::load_onnx(path));
  auto metric = analysis::make_metric("top1");
  const double our_top1 = analysis::evaluate(ours, *test_set, *metric).value;
  const double ort = ort_top1(path);
  EXPECT_NEAR(our_top1, ort, 0.001) << "slimquant " << our_top1 << " vs ONNX Runtime " << ort;
}

}  // namespace
