#pragma once
// ONNX Runtime as a peer in end-to-end tests: bench/check_deploy.js runs a model in the pinned
// onnxruntime-node and in the latest one (scripts/install-deps.sh installs both under bench/).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "slimquant/core/npy.h"
#include "test_util.h"

namespace slimquant::test {

// Node.js and both onnxruntime-node packages are installed (tests skip otherwise).
inline bool have_onnx_runtime() {
  return std::system("command -v node >/dev/null 2>&1") == 0 &&
         std::filesystem::exists(source_path("bench/node_modules/onnxruntime-node/package.json")) &&
         std::filesystem::exists(source_path("bench/node_modules/onnxruntime-node-latest/package.json"));
}

// ONNX Runtime's u8 x s8 integer kernels (DynamicQuantizeLinear's codes into MatMulInteger /
// ConvInteger) sum exactly only with VNNI: without it they multiply pairs into saturating int16
// (its documented `reduce_range` advice), which moved a dynamic model's logits by 3-7% of their
// range on an AVX2 AMD EPYC (Zen 3) while ours stay exact. Tests of dynamic files take the wider
// bound there.
inline bool onnx_runtime_integer_sums_exact() {
  return __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni");
}

// ONNX Runtime (`package`) runs `model` on the .npy `input` with default options; returns the
// model's first output (written under out_dir).
inline Tensor onnx_runtime_logits(const std::string& package, const std::string& model, const std::string& input,
                                  const std::string& out_dir) {
  const auto r = run_command("node " + source_path("bench/check_deploy.js") + " --ort-worker " + package + " " + model +
                             " " + input + " " + out_dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  EXPECT_EQ(j["load"], "ok") << r.output;
  EXPECT_EQ(j["run"], "ok") << r.output;
  return read_npy(out_dir + "/default/logits.npy");
}

}  // namespace slimquant::test
