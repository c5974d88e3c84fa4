// PTQ of a model whose state input carries its batch on axis 1 ([layers, batch, hidden], as LSTM
// and GRU states and Silero VAD's do): samples from a sample_generator and from a data set with a
// side input are stacked there, a model fixed at batch 1 is calibrated one sample at a time, and
// the INT8 model stays close to FP32.
#include <gtest/gtest.h>

#include <random>

#include "graph_builder.h"
#include "multi_input_model.h"
#include "slimquant/core/npy.h"
#include "slimquant/core/tensor_slices.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

constexpr int64_t kStateSamples = 8;

struct StateData {
  Tensor x, state;  // [8, 16], [2, 8, 8]
  StateData() {
    std::mt19937 rng(3);
    x = test::random_tensor({kStateSamples, 16}, rng);
    state = test::random_tensor({2, kStateSamples, 8}, rng);
  }
  std::map<std::string, Tensor> feeds() const { return {{"x", x}, {"state", state}}; }
};

// The INT8 model's outputs against FP32's on all samples as one batch.
double int8_sqnr_db(const ir::Graph& float_model, const ir::Graph& int8_model, const StateData& d) {
  runtime::Session fp32(float_model), int8(int8_model);
  return quant::output_sqnr_db(fp32.run(d.feeds()), int8.run(d.feeds()));
}

TEST(StateInputPtq, SampleGeneratorStacksTheStateOnItsBatchAxis) {
  test::TempDir tmp("ptq_state_gen");
  const StateData d;
  for (const bool fixed : {false, true}) {
    const ir::Graph model = test::state_input_model(fixed);
    ir::save_onnx(model, tmp.path("m.onnx"));
    quant::PostTrainingQuantizationOptions o;
    o.model_dir = tmp.path("m.onnx");
    o.batch_size = 2;
    int64_t next = 0;
    // One sample per call, without its batch dimension: x [16], state [2, 8].
    o.sample_generator = [&]() -> std::optional<std::map<std::string, Tensor>> {
      if (next == kStateSamples) return std::nullopt;
      const int64_t k = next++;
      return std::map<std::string, Tensor>{{"x", slice_along(d.x, 0, k, 1).reshaped({16})},
                                           {"state", slice_along(d.state, 1, k, 1).reshaped({2, 8})}};
    };
    quant::PostTrainingQuantization ptq(o);
    const ir::Graph& q = ptq.quantize();
    EXPECT_EQ(ptq.report().samples, static_cast<size_t>(kStateSamples)) << fixed;
    EXPECT_GT(test::count_op(q, "QuantizeLinear"), 0) << fixed;
    EXPECT_GT(int8_sqnr_db(model, q, d), 30.0) << fixed;
  }
}

TEST(StateInputPtq, DataSetSideInputOnItsBatchAxis) {
  test::TempDir tmp("ptq_state_data");
  const StateData d;
  std::filesystem::create_directories(tmp.path("calib"));
  write_npy(tmp.path("calib/x.npy"), d.x);
  write_npy(tmp.path("state.npy"), d.state);
  for (const bool fixed : {false, true}) {
    const ir::Graph model = test::state_input_model(fixed);
    ir::save_onnx(model, tmp.path("m.onnx"));
    data::DataOptions options{.spec = "npy:" + tmp.path("calib")};
    options.side_inputs = {{"state", tmp.path("state.npy"), 3, -1, false, 1}};
    const auto dataset = data::open_dataset(options);
    quant::PostTrainingQuantizationOptions o;
    o.model_dir = tmp.path("m.onnx");
    o.dataset = dataset.get();
    o.batch_size = 2;
    quant::PostTrainingQuantization ptq(o);
    const ir::Graph& q = ptq.quantize();
    EXPECT_EQ(ptq.report().samples, static_cast<size_t>(kStateSamples)) << fixed;
    EXPECT_GT(int8_sqnr_db(model, q, d), 30.0) << fixed;
  }

  // A data set that batches the state on another axis than the model's is refused, naming both.
  write_npy(tmp.path("one_state.npy"), slice_along(d.state, 1, 0, 1).reshaped({2, 8}));
  data::DataOptions first_axis{.spec = "npy:" + tmp.path("calib")};
  first_axis.side_inputs = {{"state", tmp.path("one_state.npy"), 3}};
  const auto wrong = data::open_dataset(first_axis);
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = tmp.path("m.onnx");
  o.dataset = wrong.get();
  o.batch_size = 2;
  try {
    quant::PostTrainingQuantization(o).quantize();
    FAIL() << "a state batched on axis 0 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batched along axis 0, but the model's batch axis for it is 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
