// Loop and Scan end to end: the exporter's models (tests/fixtures/make_control_flow_models.py) in
// slimquant and in ONNX Runtime, and `slimquant quantize` on a model with a Loop: the layers
// outside are quantized, the body stays float (and the command says so once), and the INT8 export
// still runs, here and in ONNX Runtime.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "onnx_runtime_peer.h"
#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "control_flow_fixtures.h"
#include "test_util.h"

using namespace slimquant;
using test::control_flow_fixture;
using test::max_abs_difference;

namespace {

// ONNX Runtime's output 'y' of `model` on the .npy `input`.
Tensor onnx_runtime_y(const std::string& model, const std::string& input, const std::string& out_dir) {
  const auto r = test::run_command("node " + test::source_path("bench/check_deploy.js") +
                                   " --ort-worker onnxruntime-node " + model + " " + input + " " + out_dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::last_json_line(r.output)["run"], "ok") << r.output;
  return read_npy(out_dir + "/default/y.npy");
}

Tensor slimquant_y(const std::string& model, const Tensor& x) {
  runtime::Session s(ir::load_onnx(model));
  return s.run({{"x", x}}).at("y");
}

size_t count_ops(const ir::Graph& g, const std::string& op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.op_type == op; }));
}

}  // namespace

TEST(LoopScanOrtInterop, ExporterLoopsAndScanMatchOnnxRuntime) {
  if (!test::have_onnx_runtime()) GTEST_SKIP() << "node or onnxruntime-node is not installed";
  test::TempDir tmp("control_flow_ort");
  for (const std::string name : {"loop_for_append", "loop_while", "scan"}) {
    const std::string model = control_flow_fixture(name + ".onnx"), input = control_flow_fixture(name + ".input.npy");
    const float difference = max_abs_difference(slimquant_y(model, read_npy(input)), onnx_runtime_y(model, input, tmp.path(name)));
    EXPECT_LT(difference, 1e-5f) << name;
    std::cout << name << ": max |slimquant - ONNX Runtime| = " << difference << std::endl;
  }
}

TEST(CliControlFlow, QuantizeLeavesTheLoopBodyFloatAndSaysSoOnce) {
  test::TempDir tmp("control_flow_quantize");
  // Calibration data: 64 rows of x drawn like the fixture's input (standard normal), which the loop
  // runs over in batches of 32 (32 iterations).
  std::filesystem::create_directories(tmp.path("calib"));
  Tensor rows(DType::kFloat32, {64, 3});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : rows.values<float>()) v = normal(rng);
  write_npy(tmp.path("calib/x.npy"), rows);
  const std::string model = control_flow_fixture("loop_for_append.onnx");
  const auto r = test::run_cli("quantize " + model + " --dataset npy:" + tmp.path("calib") + " --batch-size 32 --algo abs_max -o " +
                               tmp.path("q.onnx") + " --no-eval");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string said = "its body stays float (loop bodies are not quantized)";
  const size_t first = r.output.find(said);
  EXPECT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(said, first + 1), std::string::npos) << "said more than once:\n" << r.output;

  const ir::Graph float_model = ir::load_onnx(model), quantized = ir::load_onnx(tmp.path("q.onnx"));
  EXPECT_GT(count_ops(quantized, "DequantizeLinear"), 0u) << "the layers outside the loop are quantized";
  const auto loop = std::find_if(quantized.nodes.begin(), quantized.nodes.end(), [](const ir::Node& n) { return n.op_type == "Loop"; });
  ASSERT_NE(loop, quantized.nodes.end());
  const ir::Graph& body = *loop->attr_graph("body");
  EXPECT_EQ(count_ops(body, "QuantizeLinear") + count_ops(body, "DequantizeLinear"), 0u);
  EXPECT_EQ(count_ops(body, "MatMul"), 1u) << "the cell's Linear stays a float MatMul";

  // The INT8 export runs and stays close to the float model (quantization error of the outer layers).
  const Tensor x = read_npy(control_flow_fixture("loop_for_append.input.npy"));
  const Tensor expected = read_npy(control_flow_fixture("loop_for_append.expected.npy"));
  const Tensor int8 = slimquant_y(tmp.path("q.onnx"), x);
  const float int8_error = max_abs_difference(int8, expected);
  EXPECT_LT(int8_error, 0.05f);
  std::cout << "INT8 export: max |INT8 - float| = " << int8_error << std::endl;
  if (test::have_onnx_runtime()) {
    const float difference = max_abs_difference(int8, onnx_runtime_y(tmp.path("q.onnx"), control_flow_fixture("loop_for_append.input.npy"),
                                                                     tmp.path("ort")));
    EXPECT_LT(difference, 0.05f);
    std::cout << "INT8 export: max |slimquant - ONNX Runtime| = " << difference << std::endl;
  }
}

TEST(CliControlFlow, RunWritesASequenceOutputAsOneFilePerElement) {
  test::TempDir tmp("control_flow_run");
  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{3, ""}, {2, ""}}}};
  g.nodes.push_back(test::graph_node("SplitToSequence", {"x"}, {"rows"}));
  g.outputs = {{"rows", DType::kFloat32, std::nullopt}};
  g.sequence_values = {"rows"};
  ir::save_onnx(g, tmp.path("split.onnx"));
  write_npy(tmp.path("x.npy"), Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  const auto r = test::run_cli("run " + tmp.path("split.onnx") + " --input x=" + tmp.path("x.npy") + " --output-dir " +
                               tmp.path("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    const Tensor row = read_npy(tmp.path("out/rows." + std::to_string(k) + ".npy"));
    EXPECT_EQ(row.shape(), (Shape{1, 2}));
    EXPECT_EQ(row.to_float_vector(), (std::vector<float>{2.f * k + 1, 2.f * k + 2}));
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.path("out/rows.3.npy")));
}
