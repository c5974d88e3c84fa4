// quantize --mode weight-only --weight-bits 4: INT4 MatMul / Gemm weights in blocks behind an
// opset-21 DequantizeLinear, run here (fused MatMulQb4w) and in ONNX Runtime 1.20.1 and the latest.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "onnx_runtime_peer.h"
#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

using namespace slimquant;

namespace {

TEST(CliQuantize, FourBitBlockedWeightsRunHereAndInOnnxRuntime) {
  test::TempDir tmp("cli_q_int4");
  const std::string model = test::fixture_model("vit_small");
  auto r = test::run_cli("quantize " + model + " --mode weight-only --weight-bits 4 --block-size 32 -o " +
                         tmp.path("w4.onnx") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("INT4 in blocks of 32"), std::string::npos) << r.output;
  const auto j = test::last_json_line(r.output);
  EXPECT_EQ(j["weight_bits"], 4);
  EXPECT_LT(j["int8_bytes"].get<double>(), 0.3 * j["fp32_bytes"].get<double>());
  const ir::Graph g = ir::load_onnx(tmp.path("w4.onnx"));
  EXPECT_EQ(g.opset, 21);
  EXPECT_EQ(g.stored_4bit_types.size(), 13u);

  // GPTQ calibrates on the data given; without data it rounds to nearest and says so.
  auto gptq = test::run_cli("quantize " + model + " --mode weight-only --weight-bits 4 --weight-rounding gptq "
                            "fashion-mnist:test --limit 128 --batch-size 32 -o " +
                            tmp.path("g4.onnx") + " --json");
  ASSERT_EQ(gptq.exit_code, 0) << gptq.output;
  EXPECT_EQ(ir::load_onnx(tmp.path("g4.onnx")).metadata.at("slimquant.weight_rounding"), "gptq");
  auto fallback = test::run_cli("quantize " + model + " --mode weight-only --weight-bits 4 --weight-rounding gptq -o " +
                                tmp.path("f4.onnx"));
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("rounding to nearest"), std::string::npos) << fallback.output;

  for (const std::string bad : {"--mode weight-only --weight-bits 4 --block-size 48",
                                "--mode weight-only --block-size 32", "--block-size 32 --weight-bits 4",
                                "--mode weight-only --weight-bits 4 --weight-rounding awq"}) {
    auto b = test::run_cli("quantize " + model + " " + bad + " fashion-mnist:test --limit 16 -o " + tmp.path("x.onnx"));
    EXPECT_EQ(b.exit_code, 5) << bad << ": " << b.output;
  }

  const std::string input = test::source_path("tests/fixtures/models/vit_small.input.npy");
  auto run = test::run_cli("run " + tmp.path("w4.onnx") + " --input input=" + input + " --output-dir " + tmp.path("ours"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Tensor ours = read_npy(tmp.path("ours/logits.npy"));
  if (!test::have_onnx_runtime()) GTEST_SKIP() << "Node.js / onnxruntime-node not installed";
  auto worst_and_range = [&](const Tensor& ort) {
    float worst = 0, range = 0;
    for (int64_t i = 0; i < ours.numel(); ++i) {
      worst = std::max(worst, std::abs(ort.data<float>()[i] - ours.data<float>()[i]));
      range = std::max(range, std::abs(ours.data<float>()[i]));
    }
    return std::pair{worst, range};
  };
  for (const char* package : {"onnxruntime-node", "onnxruntime-node-latest"}) {
    const std::string out = tmp.path(std::string("ort_") + package);
    // Default options: ORT fuses DequantizeLinear(INT4) -> MatMul into its MatMulNBits, which by
    // default (accuracy level 4) quantizes the activations to int8 per block as well: close, not equal.
    const Tensor ort = test::onnx_runtime_logits(package, tmp.path("w4.onnx"), input, out);
    ASSERT_EQ(ort.numel(), ours.numel()) << package;
    const auto [worst, range] = worst_and_range(ort);
    EXPECT_LT(worst, 1e-2f * range) << package << ": MatMulNBits with int8 activations";
    // Graph optimizations off (check_deploy.js's second run): the blocked DequantizeLinear as the
    // spec defines it, then float MatMul: equal within float rounding.
    const auto [worst_unfused, range_unfused] = worst_and_range(read_npy(out + "/unfused/logits.npy"));
    EXPECT_LT(worst_unfused, 1e-4f * range_unfused + 1e-5f) << package << ": the same dequantized weights";
  }
}

// --int4-activations int8: recorded in the file's metadata, read by our runtime's 4-bit MatMul
// (rows of A rounded to int8 per group of 32 where the MatMul has at most 8 rows: vit_small's head);
// the result moves by that rounding only. Asked for without 4-bit weight-only, or with another
// value, it is refused.
TEST(CliQuantize, Int8ActivationsForFourBitWeightsAreRecordedAndRun) {
  test::TempDir tmp("cli_q_int4_i8");
  const std::string model = test::fixture_model("vit_small");
  for (const char* form : {"float", "int8"}) {
    auto r = test::run_cli("quantize " + model + " --mode weight-only --weight-bits 4 --int4-activations " + form +
                           " -o " + tmp.path(std::string(form) + ".onnx"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const ir::Graph g = ir::load_onnx(tmp.path("int8.onnx"));
  EXPECT_EQ(g.metadata.at("slimquant.int4_activations"), "int8");
  EXPECT_EQ(ir::load_onnx(tmp.path("float.onnx")).metadata.count("slimquant.int4_activations"), 0u);

  const std::string input = test::source_path("tests/fixtures/models/vit_small.input.npy");
  Tensor outputs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string form = i == 0 ? "float" : "int8";
    auto run = test::run_cli("run " + tmp.path(form + ".onnx") + " --input input=" + input + " --output-dir " +
                             tmp.path("out_" + form));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    outputs[i] = read_npy(tmp.path("out_" + form + "/logits.npy"));
  }
  ASSERT_EQ(outputs[0].numel(), outputs[1].numel());
  float worst = 0, range = 0;
  for (int64_t i = 0; i < outputs[0].numel(); ++i) {
    worst = std::max(worst, std::abs(outputs[0].data<float>()[i] - outputs[1].data<float>()[i]));
    range = std::max(range, std::abs(outputs[0].data<float>()[i]));
  }
  EXPECT_GT(worst, 0.f) << "the head's activations were not rounded";
  EXPECT_LT(worst, 1e-2f * range);

  for (const std::string bad : {"--mode weight-only --int4-activations int8",
                                "--mode weight-only --weight-bits 4 --int4-activations fp16"}) {
    auto b = test::run_cli("quantize " + model + " " + bad + " -o " + tmp.path("x.onnx"));
    EXPECT_EQ(b.exit_code, 5) << bad << ": " << b.output;
    EXPECT_NE(b.output.find("int4_activations"), std::string::npos) << b.output;
  }
}

}  // namespace
