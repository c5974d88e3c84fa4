// Fuzz target: ONNX model bytes -> load_onnx (protobuf parsing, onnx::checker, graph validation,
// external data), Session construction (constant folding, BatchNorm folding, supported-op check),
// input shape binding with ONNX shape inference, and, when the declared inputs are small, one run
// on inputs of ones (plan compilation and the kernels). An optional second part (after
// fuzz::kPartSeparator) is written next to the model as "weights.bin", the name the seed models'
// external data use.
#include <map>
#include <string>

#include "fuzz_util.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slimquant;
  const auto [model, external_data] = fuzz::split_parts(data, size);
  fuzz::clear_scratch_dir();
  const auto model_path = fuzz::scratch_dir() / "model.onnx";
  fuzz::write_file(model_path, model);
  if (external_data) fuzz::write_file(fuzz::scratch_dir() / "weights.bin", *external_data);

  fuzz::expect_clean_errors([&] {
    runtime::SessionOptions options;
    options.num_threads = 1;
    runtime::Session session(ir::load_onnx(model_path.string()), options);
    // The shapes a first run would bind: declared dims, symbolic ones as 1.
    std::map<std::string, Shape> shapes;
    for (const auto& input : session.inputs()) {
      if (!input.dims) continue;
      Shape shape;
      for (const auto& dim : *input.dims) shape.push_back(dim.known() ? dim.value : 1);
      shapes[input.name] = shape;
    }
    ir::Graph bound = session.graph();
    ir::bind_input_shapes(bound, shapes);

    // Ones, not zeros: an integer division by a zero input is the data's fault, not the model's.
    constexpr int64_t kMaxFedElements = 1 << 16;
    std::map<std::string, Tensor> feeds;
    int64_t fed_elements = 0;
    for (const auto& input : session.inputs()) {
      const auto shape = shapes.find(input.name);
      if (shape == shapes.end() || input.dtype == DType::kUndefined) return;
      int64_t numel = 1;
      for (const int64_t d : shape->second) {
        if (d < 0 || d > kMaxFedElements) return;
        numel *= d;  // both factors <= 2^16: no overflow
        if (numel > kMaxFedElements) return;
      }
      fed_elements += numel;
      if (fed_elements > kMaxFedElements) return;
      Tensor ones(DType::kFloat32, shape->second);
      for (float& v : ones.values<float>()) v = 1.f;
      feeds[input.name] = ones.cast(input.dtype);
    }
    session.run(feeds);
  });
  return 0;
}
