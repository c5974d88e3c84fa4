// consumer MODEL.onnx INPUT.npy LOGITS.npy: runs the model in FP32 and INT8 (PTQ calibrated on the
// input) through the installed library, checks the FP32 logits against the reference, and prints
// "ok" and the two top-1 agreements.
#include <cmath>
#include <cstdio>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"

int main(int argc, char** argv) {
  using namespace slimquant;
  if (argc != 4) {
    std::fprintf(stderr, "usage: consumer MODEL.onnx INPUT.npy LOGITS.npy\n");
    return 2;
  }
  try {
    const ir::Graph model = ir::load_model(argv[1]);
    const Tensor input = read_npy(argv[2]), expected = read_npy(argv[3]);
    const std::string input_name = model.inputs.at(0).name;
    runtime::Session fp32(model);
    const Tensor logits = fp32.run({{input_name, input}}).begin()->second;
    if (logits.shape() != expected.shape()) {
      std::fprintf(stderr, "logits shape %s, expected %s\n", shape_str(logits.shape()).c_str(), shape_str(expected.shape()).c_str());
      return 1;
    }
    double max_diff = 0;
    for (int64_t i = 0; i < logits.numel(); ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::abs(logits.data<float>()[i] - expected.data<float>()[i])));
    quant::QuantConfig config;
    config.global().activation = "abs_max";
    quant::PTQ ptq(config);
    ptq.quantize(model);
    ptq.sample({{input_name, input}});
    runtime::Session int8_sim(ptq.convert());
    const Tensor q = int8_sim.run({{input_name, input}}).begin()->second;
    const int64_t rows = logits.shape().at(0), classes = logits.numel() / rows;
    int64_t agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
      auto argmax = [&](const Tensor& t) {
        const float* p = t.data<float>() + r * classes;
        int64_t best = 0;
        for (int64_t c = 1; c < classes; ++c)
          if (p[c] > p[best]) best = c;
        return best;
      };
      agree += argmax(logits) == argmax(q);
    }
    std::printf("fp32 max |logit - reference| %.3g, int8 top-1 agreement %lld/%lld, %zu layers\n", max_diff,
                static_cast<long long>(agree), static_cast<long long>(rows), ptq.layers().size());
    if (max_diff > 1e-3 || agree * 10 < rows * 8) return 1;
    std::printf("ok\n");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
