#pragma once
// Helpers shared by the INT8 lowering and parity tests.
#include <cmath>
#include <string>
#include <vector>

#include "slimquant/core/error.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/graph.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/ptq.h"
#include "test_util.h"

namespace slimquant::test {

// PTQ of a fixture model, calibrated on the first `images` Fashion-MNIST training images in batches
// of 32; returns the QDQ graph.
inline ir::Graph calibrated_qdq(const std::string& model, size_t images, quant::QuantConfig config = quant::QuantConfig()) {
  quant::PTQ ptq(std::move(config));
  ptq.quantize(ir::load_onnx(fixture_model(model)));
  data::DataOptions o;
  o.spec = "fashion-mnist:train";
  o.limit = images;
  auto ds = data::open_dataset(o);
  for (const auto& b : data::BatchLoader(*ds, 32)) ptq.sample(b.inputs);
  return ptq.convert();
}

// The fused node writing the lowered graph's (first) output.
inline const ir::Node& last_layer(const ir::Graph& lowered) {
  const std::string out = lowered.outputs.at(0).name;
  for (const auto& n : lowered.nodes)
    if (!n.outputs.empty() && n.outputs[0] == out && n.domain == "com.slimquant") return n;
  fail(ErrorKind::kInternal, "the last layer was not lowered");
}

// One quantization step of each logit: step_c = s_in * s_w[c] * ||w_q[c,:]||_1, the most one step on
// every input of the (linear, float-output) last layer can move logit c.
inline std::vector<float> logit_steps(const ir::Graph& lowered) {
  const ir::Node& n = last_layer(lowered);
  const float s_in = n.attr_float("x_scale", 0.f);
  const auto s_w = n.attr_floats("w_scale");
  const Tensor& w = *lowered.initializer(n.inputs.at(1));
  // Output channels: rows of a transB Gemm weight, columns otherwise.
  const bool rows = n.op_type == "QGemm" && n.attr_int("transB", 0) != 0;
  const int64_t channels = rows ? w.dim(0) : w.dim(1), k = rows ? w.dim(1) : w.dim(0);
  std::vector<float> steps(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    double l1 = 0;
    for (int64_t i = 0; i < k; ++i) l1 += std::abs(w.data<int8_t>()[rows ? c * k + i : i * channels + c]);
    steps[c] = static_cast<float>(s_in * s_w[s_w.size() == 1 ? 0 : c] * l1);
  }
  return steps;
}

}  // namespace slimquant::test
