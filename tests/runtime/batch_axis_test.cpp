// Batch axes from declared shapes (runtime::input_batch_axes): a recurrent state [layers, batch,
// hidden] carries its batch on axis 1, and a session that splits a batch (a model fixed at batch 1)
// splits and joins such inputs and outputs there.
#include <gtest/gtest.h>

#include <random>

#include "graph_builder.h"
#include "multi_input_model.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

ir::ValueInfo declared(std::vector<ir::Dim> dims) { return {"v", DType::kFloat32, std::move(dims)}; }

const ir::Dim kUnknownDim{-1, ""};

TEST(BatchAxes, DeclaredShapesShowWhereTheBatchIs) {
  const ir::Dim batch_n{-1, "N"}, fixed_one{1, ""};
  // The batch dynamic and unnamed (Silero VAD): a first axis fixed at more than one is not the
  // batch, the one dynamic axis is.
  EXPECT_EQ(runtime::declared_batch_axis(declared({{2, ""}, kUnknownDim, {128, ""}}), kUnknownDim), 1u);
  EXPECT_EQ(runtime::declared_batch_axis(declared({kUnknownDim, {16, ""}}), kUnknownDim), std::nullopt);
  EXPECT_EQ(runtime::declared_batch_axis(declared({{1, ""}, kUnknownDim}), kUnknownDim), std::nullopt)
      << "a first axis of 1 may be a batch of one";
  EXPECT_EQ(runtime::declared_batch_axis(declared({{2, ""}, kUnknownDim, kUnknownDim}), kUnknownDim), std::nullopt)
      << "two dynamic axes: none shown";
  EXPECT_EQ(runtime::declared_batch_axis(declared({{4, ""}, {4, ""}}), kUnknownDim), std::nullopt);
  // A named batch: the axis of that name, wherever it is.
  EXPECT_EQ(runtime::declared_batch_axis(declared({{-1, "layers"}, {-1, "N"}, {8, ""}}), batch_n), 1u);
  EXPECT_EQ(runtime::declared_batch_axis(declared({{-1, "N"}, {3, ""}}), batch_n), 0u);
  // A fixed batch: the first axis when it has the batch's size, else the one axis that has it.
  EXPECT_EQ(runtime::declared_batch_axis(declared({{1, ""}, {16, ""}}), fixed_one), 0u);
  EXPECT_EQ(runtime::declared_batch_axis(declared({{2, ""}, {1, ""}, {8, ""}}), fixed_one), 1u);
  EXPECT_EQ(runtime::declared_batch_axis(declared({}), kUnknownDim), std::nullopt) << "a scalar";
  EXPECT_EQ(runtime::declared_batch_axis({"v", DType::kFloat32, std::nullopt}, kUnknownDim), std::nullopt);

  for (const bool fixed : {false, true}) {
    const ir::Graph g = test::state_input_model(fixed);
    EXPECT_EQ(runtime::input_batch_axes(g.inputs), (runtime::BatchAxes{{"state", 1}})) << fixed;
    EXPECT_EQ(runtime::batch_dimension(g.inputs).value, fixed ? 1 : -1);
  }
}

TEST(BatchAxes, FeedRowsAndJoinRowsWorkOnEachTensorsAxis) {
  Tensor state(DType::kFloat32, {2, 3, 2});
  for (int64_t i = 0; i < state.numel(); ++i) state.data<float>()[i] = static_cast<float>(i);
  const Tensor x = Tensor::from_vector<float>({3, 1}, {10, 11, 12});
  const runtime::BatchAxes axes{{"state", 1}};
  const auto rows = runtime::feed_rows({{"state", state}, {"x", x}, {"sr", Tensor::scalar<int64_t>(16000)}}, 1, 2, axes);
  EXPECT_EQ(rows.at("state").shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(rows.at("state").to_float_vector(), (std::vector<float>{2, 3, 4, 5, 8, 9, 10, 11}));
  EXPECT_EQ(rows.at("x").to_float_vector(), (std::vector<float>{11, 12}));
  EXPECT_EQ(rows.at("sr").rank(), 0u);
  EXPECT_EQ(runtime::batch_rows({{"state", state}}, axes), 3);
  EXPECT_EQ(runtime::batch_rows({{"state", state}}, {}), 2) << "without the axes, the first axis";

  const auto first = runtime::feed_rows({{"state", state}}, 0, 2, axes);
  const auto rest = runtime::feed_rows({{"state", state}}, 2, 1, axes);
  const Tensor joined = runtime::join_rows({first, rest}, 3, 2, axes).at("state");
  EXPECT_EQ(joined.shape(), state.shape());
  EXPECT_EQ(joined.to_float_vector(), state.to_float_vector());
  // Joined on the first axis instead, the parts are not one row per sample.
  EXPECT_THROW(runtime::join_rows({first, rest}, 3, 2), Error);
}

// The model fixed at batch 1 runs a batch of 3 one sample at a time: x split on axis 0, the state on
// axis 1, y (declared [2, 1, 4]) and state_out (declared without a shape, shaped like the state)
// joined on axis 1. The result is the dynamic model's on the whole batch, and each sample's alone.
TEST(BatchAxes, AModelOfBatchOneRunsAStateBatchInParts) {
  std::mt19937 rng(5);
  const Tensor x = test::random_tensor({3, 16}, rng), state = test::random_tensor({2, 3, 8}, rng);
  runtime::Session fixed(test::state_input_model(true)), dynamic(test::state_input_model(false));
  const auto parts = fixed.run({{"x", x}, {"state", state}});
  EXPECT_EQ(fixed.batch_limit(), 1);
  const auto whole = dynamic.run({{"x", x}, {"state", state}});
  ASSERT_EQ(parts.size(), 2u);
  for (const auto& [name, value] : whole) {
    ASSERT_EQ(parts.at(name).shape(), value.shape()) << name;
    const std::vector<float> a = parts.at(name).to_float_vector(), b = value.to_float_vector();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << name << " at " << i;
  }
  const runtime::BatchAxes axes{{"state", 1}};
  const std::string y = fixed.outputs().at(0).name;
  for (int64_t k = 0; k < 3; ++k) {
    const auto alone = fixed.run(runtime::feed_rows({{"x", x}, {"state", state}}, k, 1, axes));
    const Tensor y_k = runtime::feed_rows({{y, parts.at(y)}}, k, 1, {{y, 1}}).at(y);
    EXPECT_EQ(alone.at(y).to_float_vector(), y_k.to_float_vector()) << "sample " << k;
  }
}

}  // namespace
