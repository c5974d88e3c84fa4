// 8-bit-weight INT8 models give the same results on every CPU. tests/fixtures/int8/ holds two QDQ
// exports (8-bit weights, `slimquant quantize` defaults) and the logits our integer execution gave
// for the first 256 Fashion-MNIST test images on a CPU with VNNI (exact int8 dot products). Run on a
// CPU without VNNI (or with DNNL_MAX_CPU_ISA=AVX2, as scripts/test.sh does), the 8-bit weights take
// the exact f32 path; every logit must stay within one quantization step of the VNNI result.
//
// Regenerate the goldens (on a VNNI CPU only) with SLIMQUANT_WRITE_INT8_GOLDEN=1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "quant/int8_test_util.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/core/npy.h"
#include "slimquant/quant/lowering.h"

using namespace slimquant;

namespace {

class Int8Golden : public ::testing::TestWithParam<const char*> {};

TEST_P(Int8Golden, EightBitWeightLogitsMatchTheVnniResultWithinOneStep) {
  const std::string model = GetParam();
  const std::string dir = test::source_path("tests/fixtures/int8/");
  const ir::Graph qdq = ir::load_onnx(dir + model + ".int8.onnx");
  ASSERT_EQ(qdq.metadata.at("slimquant.weight_bits"), "8");
  const ir::Graph lowered = quant::lower_to_int8(qdq);
  const std::vector<float> steps = test::logit_steps(lowered);

  data::DataOptions o;
  o.spec = "fashion-mnist:test";
  o.limit = 256;
  auto test_set = data::open_dataset(o);
  const Tensor images = data::BatchLoader(*test_set, 256).batch(0).inputs;
  runtime::SessionOptions so;
  so.num_threads = 1;
  runtime::Session session(lowered, so);
  const Tensor logits = session.run({{session.inputs()[0].name, images}}).at(lowered.outputs.at(0).name);

  const std::string golden_path = dir + model + ".int8.golden.npy";
  const bool vnni = runtime::int8::cpu_has_exact_int8_dot();
  if (std::getenv("SLIMQUANT_WRITE_INT8_GOLDEN")) {
    ASSERT_TRUE(vnni) << "goldens are the VNNI (exact int8) result: write them on a CPU with VNNI";
    write_npy(golden_path, logits);
    GTEST_SKIP() << "wrote " << golden_path;
  }
  const Tensor golden = read_npy(golden_path);
  ASSERT_EQ(golden.shape(), logits.shape());
  const int64_t classes = logits.dim(1);
  ASSERT_EQ(steps.size(), static_cast<size_t>(classes));
  const float* g = golden.data<float>();
  const float* y = logits.data<float>();
  double worst = 0;
  for (int64_t i = 0; i < logits.numel(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(g[i]) - y[i]) / steps[static_cast<size_t>(i % classes)]);
  std::printf("[ %s ] %s: worst logit difference from the VNNI golden %.4f steps\n", model.c_str(),
              vnni ? "VNNI" : "no VNNI", worst);
  // The same bound on VNNI CPUs: the integer sums are exact there, but another CPU's kernels may
  // round a requantization tie the other way (on the CPU that wrote the goldens: 0 steps).
  EXPECT_LE(worst, 1.0);
}

INSTANTIATE_TEST_SUITE_P(FixtureExports, Int8Golden, ::testing::Values("resnet_small", "mobilenetv2_small"));

}  // namespace
