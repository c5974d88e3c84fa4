// The proof that a model computes each sample on its own (runtime/sample_independence.h), on the
// forms exporters write (Flatten, Shape -> Reshape chains, ViT's expanded class token, PP-OCR's
// transposed attention heads, recurrent layers with the batch second), and the ops that mix
// samples, each named; and Session::run taking a batch in parts with the whole batch's outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph_builder.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;
using runtime::analyze_sample_independence;

namespace {

struct BatchModel {
  test::GraphBuilder b;
  explicit BatchModel(Shape x_shape, int64_t opset = 13) {
    b.g.opset = opset;
    ir::ValueInfo x = test::float_value("x", x_shape);
    (*x.dims)[0] = ir::Dim{-1, "batch"};
    b.g.inputs.push_back(x);
  }
  std::string ints(std::vector<int64_t> v) {
    return b.constant(Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  std::string scalar(int64_t v) { return b.constant(Tensor::scalar<int64_t>(v)); }
  std::string floats(Shape shape, float value = 0.5f) {
    Tensor t(DType::kFloat32, shape);
    for (float& v : t.values<float>()) v = value;
    return b.constant(t);
  }
  // The batch size as a [1] vector, as exporters compute it: Shape -> Gather(0) -> Unsqueeze.
  std::string batch_size_of(const std::string& v) {
    return b.node("Unsqueeze", {b.node("Gather", {b.node("Shape", {v}), scalar(0)}, {{"axis", int64_t{0}}}), ints({0})});
  }
  runtime::SampleIndependence analyze(const std::string& y) {
    b.g.outputs = {test::float_value(y, {})};
    b.g.outputs[0].dims.reset();
    return analyze_sample_independence(b.g, runtime::input_batch_axes(b.g.inputs));
  }
};

void expect_samples_mixed(const runtime::SampleIndependence& r, const std::string& why) {
  EXPECT_FALSE(r.independent);
  EXPECT_NE(r.reason.find(why), std::string::npos) << r.reason;
}

TEST(SampleIndependence, ConvolutionsPoolFlattenAndGemmKeepSamplesApart) {
  BatchModel m({2, 3, 8, 8});
  std::string v = m.b.node("Conv", {"x", m.floats({4, 3, 3, 3})}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  v = m.b.node("BatchNormalization", {v, m.floats({4}), m.floats({4}), m.floats({4}), m.floats({4}, 1.f)});
  v = m.b.node("Mul", {v, m.b.node("Sigmoid", {v})});
  v = m.b.node("Mul", {v, m.b.node("GlobalAveragePool", {v})});  // squeeze-excitation's gate: [N, 4, 1, 1]
  v = m.b.node("Add", {v, m.floats({4, 1, 1})});
  v = m.b.node("Flatten", {m.b.node("MaxPool", {v}, {{"kernel_shape", std::vector<int64_t>{2, 2}}})});
  const auto r = m.analyze(m.b.node("Gemm", {v, m.floats({10, 64}), m.floats({10})}, {{"transB", int64_t{1}}}));
  EXPECT_TRUE(r.independent) << r.reason;
  EXPECT_TRUE(r.output_axes.empty());
}

TEST(SampleIndependence, ReshapesToTheBatchSizeOrACopiedFirstAxisKeepIt) {
  BatchModel m({2, 4, 6});
  const std::string n = m.batch_size_of("x");
  std::string v = m.b.node("Reshape", {"x", m.b.node("Concat", {n, m.ints({-1})}, {{"axis", int64_t{0}}})});
  v = m.b.node("Reshape", {v, m.ints({0, 6, -1})});  // paddle2onnx copies the batch with 0
  const auto r = m.analyze(m.b.node("Softmax", {v}, {{"axis", int64_t{-1}}}));
  EXPECT_TRUE(r.independent) << r.reason;

  // Flattened whole, or N * 4 rows of 6: each sample still on its own, but an output a part of
  // the batch cannot be cut from.
  BatchModel flat({2, 4, 6});
  expect_samples_mixed(flat.analyze(flat.b.node("Reshape", {"x", flat.ints({-1})})), "merged with another axis");
  BatchModel merged({2, 4, 6});
  const std::string rows = merged.b.node("Mul", {merged.batch_size_of("x"), merged.ints({4})});
  expect_samples_mixed(merged.analyze(merged.b.node(
                   "Reshape", {"x", merged.b.node("Concat", {rows, merged.ints({6})}, {{"axis", int64_t{0}}})})),
               "merged with another axis");
  BatchModel fixed({2, 4, 6});  // [1, 24]: a batch of one baked in
  expect_samples_mixed(fixed.analyze(fixed.b.node("Reshape", {"x", fixed.ints({1, 24})})), "Reshape");
  // [N, 4, 6] -> [4, N, 6] -> [N, 24] by Reshape, not Transpose: each row takes parts of 4 samples.
  BatchModel viewed({2, 4, 6});
  const std::string moved = viewed.b.node("Transpose", {"x"}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string count = viewed.batch_size_of("x");
  expect_samples_mixed(viewed.analyze(viewed.b.node(
                   "Reshape", {moved, viewed.b.node("Concat", {count, viewed.ints({24})}, {{"axis", int64_t{0}}})})),
               "across samples");
  // Slicing another axis to the batch size makes that axis depend on N.
  BatchModel sliced({2, 8});
  expect_samples_mixed(sliced.analyze(sliced.b.node("Slice", {"x", sliced.ints({0}), sliced.batch_size_of("x"),
                                                              sliced.ints({1})})),
                       "depend on the batch size");
}

// torchvision's nn.MultiheadAttention as exported: [N, L, E] -> [L, N, E], the heads split off with
// the batch, Reshape to [L, N * heads, E / heads] (sizes read with Shape -> Gather, N times heads by
// Mul), attention over the N * heads stack, back to [L, N, heads, ...] through [L * N, E] rows for
// the output projection (a Gemm), and [N, L, E] again.
std::string torchvision_attention(BatchModel& m, int64_t heads, int64_t embed, std::mt19937& rng) {
  auto& b = m.b;
  auto dim_of = [&](const std::string& v, int64_t i) {
    return b.node("Gather", {b.node("Shape", {v}), m.scalar(i)}, {{"axis", int64_t{0}}});
  };
  auto unsq = [&](const std::string& v) { return b.node("Unsqueeze", {v, m.ints({0})}); };
  auto cat = [&](std::vector<std::string> parts) { return b.node("Concat", parts, {{"axis", int64_t{0}}}); };
  const std::string seq = b.node("Transpose", {"x"}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string tokens = dim_of(seq, 0), batch = dim_of(seq, 1), width = dim_of(seq, 2);
  const std::string stacked = b.node("Mul", {batch, m.scalar(heads)});
  const std::string head_width = b.node("Cast", {b.node("Div", {width, m.scalar(heads)})}, {{"to", int64_t{7}}});
  auto split_heads = [&](const std::string& v) {
    const std::string r = b.node("Reshape", {v, cat({unsq(tokens), unsq(stacked), unsq(head_width)})});
    return b.node("Transpose", {r}, {{"perm", std::vector<int64_t>{1, 0, 2}}});  // [N * heads, L, E / heads]
  };
  const std::string q = split_heads(b.node("MatMul", {seq, b.constant(test::random_tensor({embed, embed}, rng))}));
  const std::string k = split_heads(b.node("MatMul", {seq, b.constant(test::random_tensor({embed, embed}, rng))}));
  const std::string v = split_heads(seq);
  const std::string kt = b.node("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
  const std::string att = b.node("Softmax", {b.node("MatMul", {q, kt})}, {{"axis", int64_t{-1}}});
  const std::string mixed = b.node("Transpose", {b.node("MatMul", {att, v})}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string rows =
      b.node("Reshape", {mixed, cat({unsq(b.node("Mul", {tokens, batch})), unsq(width)})});  // [L * N, E]
  const std::string projected = b.node("Gemm", {rows, b.constant(test::random_tensor({embed, embed}, rng)),
                                                b.constant(test::random_tensor({embed}, rng))},
                                       {{"transB", int64_t{1}}});
  const std::string back = b.node("Reshape", {projected, cat({unsq(tokens), unsq(batch), unsq(dim_of(projected, 1))})});
  return b.node("Transpose", {back}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
}

TEST(SampleIndependence, AttentionHeadsStackedWithTheBatchKeepSamplesApart) {
  std::mt19937 rng(5);
  BatchModel m({2, 5, 8});
  (*m.b.g.inputs[0].dims)[1] = ir::Dim{5, ""};
  const std::string y = torchvision_attention(m, 2, 8, rng);
  const auto r = m.analyze(y);
  ASSERT_TRUE(r.independent) << r.reason;
  EXPECT_TRUE(r.output_axes.empty());

  // Taken in parts of one sample, a batch of 3 gives the whole batch's outputs.
  m.b.g.outputs = {test::float_value(y, {})};
  m.b.g.outputs[0].dims.reset();
  runtime::SessionOptions whole_options, single;
  whole_options.split_batches = false;
  single.samples_per_part = 1;
  runtime::Session whole(m.b.g, whole_options), parts(m.b.g, single);
  ASSERT_TRUE(parts.samples_independent()) << parts.samples_dependence();
  const Tensor x = test::random_tensor({3, 5, 8}, rng);
  const auto want = whole.run({{"x", x}}).at(y).to_float_vector();
  const auto got = parts.run({{"x", x}}).at(y).to_float_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f * (1.f + std::abs(want[i]))) << i;

  // The heads stacked with the batch the other way round ([L, heads * N]: sample-major would need
  // N outermost) mix samples when projected: refused.
  BatchModel swapped({2, 5, 8});
  (*swapped.b.g.inputs[0].dims)[1] = ir::Dim{5, ""};
  const std::string seq = swapped.b.node("Transpose", {"x"}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string n = swapped.b.node("Gather", {swapped.b.node("Shape", {seq}), swapped.scalar(1)}, {{"axis", int64_t{0}}});
  const std::string target = swapped.b.node(
      "Concat", {swapped.ints({5, 2}), swapped.b.node("Unsqueeze", {n, swapped.ints({0})}), swapped.ints({4})},
      {{"axis", int64_t{0}}});
  expect_samples_mixed(swapped.analyze(swapped.b.node("Reshape", {seq, target})), "across samples");
}

// torchvision's packed q / k / v projection: its Slice bounds come from the projection's Shape
// ((E + 2) / 3 times 1, 2, 3), which ONNX's shape inference loses behind a Reshape to a computed
// target. The proof knows them: they become constants, the Shape nodes go, and the projection
// splits into one MatMul per part. The batch size itself is never made a constant. The sum
// q + k + v checks the outputs: x (Wq + Wk + Wv) + (bq + bk + bv).
TEST(SampleIndependence, SizesThatDoNotDependOnTheBatchFoldToConstants) {
  std::mt19937 rng(9);
  BatchModel m({2, 5, 8});
  auto& b = m.b;
  auto dim_of = [&](const std::string& v, int64_t i) {
    return b.node("Gather", {b.node("Shape", {v}), m.scalar(i)}, {{"axis", int64_t{0}}});
  };
  // [N, 5 * 8] and back to [N, 5, 8] through targets computed from sizes: the shapes are lost.
  const std::string n = m.batch_size_of("x");
  const std::string flat = b.node("Reshape", {"x", b.node("Concat", {n, m.ints({-1})}, {{"axis", int64_t{0}}})});
  const std::string tokens = b.node("Unsqueeze", {b.node("Div", {dim_of(flat, 1), m.scalar(8)}), m.ints({0})});
  const std::string unflat =
      b.node("Reshape", {flat, b.node("Concat", {n, tokens, m.ints({8})}, {{"axis", int64_t{0}}})});
  const std::string seq = b.node("Transpose", {unflat}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const Tensor w = test::random_tensor({8, 24}, rng), bias = test::random_tensor({24}, rng);
  const std::string proj = b.node("Add", {b.constant(bias), b.node("MatMul", {seq, b.constant(w)})});
  const std::string third = b.node("Div", {b.node("Add", {dim_of(proj, 2), m.scalar(2)}), m.scalar(3)});
  auto bound = [&](int64_t k) { return b.node("Unsqueeze", {b.node("Mul", {third, m.scalar(k)}), m.ints({0})}); };
  std::vector<std::string> bounds = {m.ints({0}), bound(1), bound(2), bound(3)};
  std::vector<std::string> parts;
  for (size_t k = 0; k < 3; ++k) parts.push_back(b.node("Slice", {proj, bounds[k], bounds[k + 1], m.ints({-1})}));
  const std::string sum = b.node("Add", {b.node("Add", {parts[0], parts[1]}), parts[2]});
  const std::string y = b.node("Transpose", {sum}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.g.outputs = {test::float_value(y, {})};
  b.g.outputs[0].dims.reset();
  const ir::Graph original = b.g;

  const std::map<std::string, Tensor> known = runtime::batch_invariant_sizes(original, runtime::input_batch_axes(original.inputs));
  ASSERT_TRUE(known.count(third));
  EXPECT_EQ(known.at(third).to_int64_vector(), std::vector<int64_t>{8});
  EXPECT_EQ(known.at(bounds[3]).to_int64_vector(), std::vector<int64_t>{24});
  EXPECT_EQ(known.at(tokens).to_int64_vector(), std::vector<int64_t>{5});
  EXPECT_FALSE(known.count(n)) << "the batch size depends on the batch";

  ir::Graph folded = original;
  EXPECT_GT(runtime::fold_batch_invariant_sizes(folded), 0);
  for (const auto& node : folded.nodes) {
    if (node.op_type == "Shape") {
      EXPECT_EQ(node.inputs[0], "x") << "only the batch size's Shape is left";
    }
    if (node.op_type == "Slice") {
      for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(folded.is_initializer(node.inputs[i])) << node.inputs[i];
    }
  }
  EXPECT_EQ(ir::total(ir::apply_rules(folded, {ir::split_matmul_by_column_slices_rule()})), 1);

  // The session folds and splits when it plans a shape (at batch 3, bound: the sizes come from
  // the model as loaded): the sizes and the packed product are never computed, the parts are.
  // A batch of 3 gives x (Wq + Wk + Wv) + (bq + bk + bv).
  runtime::Session session(original);
  const Tensor x = test::random_tensor({3, 5, 8}, rng);
  std::set<std::string> computed;
  runtime::RunOptions watch;
  watch.on_value = [&](const std::string& name, const Tensor&) { computed.insert(name); };
  const Tensor got = session.run({{"x", x}}, watch).at(y);
  EXPECT_FALSE(computed.count(third));
  EXPECT_FALSE(computed.count(proj));
  EXPECT_TRUE(computed.count(parts[1]));
  ASSERT_EQ(got.shape(), (Shape{3, 5, 8}));
  for (int64_t s = 0; s < 15; ++s)
    for (int64_t c = 0; c < 8; ++c) {
      double want = 0;
      for (int64_t part = 0; part < 3; ++part) {
        want += bias.data<float>()[part * 8 + c];
        for (int64_t i = 0; i < 8; ++i) want += double{x.data<float>()[s * 8 + i]} * w.data<float>()[i * 24 + part * 8 + c];
      }
      EXPECT_NEAR(got.data<float>()[s * 8 + c], want, 1e-4) << s << " " << c;
    }
}

// A per-axis QuantizeLinear / DequantizeLinear keeps its input's sizes: its scales [C] align with
// `axis`, not with the last axis as a broadcast would (the proof had taken [N, 4, 6] to [N, 4, 4]).
TEST(SampleIndependence, PerAxisQuantizersKeepTheirInputsSizes) {
  BatchModel m({2, 4, 6});
  const std::string scale = m.floats({4}, 0.1f);
  const std::string zero = m.b.constant(Tensor::from_vector<int8_t>({4}, {0, 0, 0, 0}));
  const std::string q = m.b.node("QuantizeLinear", {"x", scale, zero}, {{"axis", int64_t{1}}});
  const std::string dq = m.b.node("DequantizeLinear", {q, scale, zero}, {{"axis", int64_t{1}}});
  const std::string width = m.b.node("Gather", {m.b.node("Shape", {dq}), m.scalar(2)}, {{"axis", int64_t{0}}});
  const std::string rows = m.b.node("Reshape", {dq, m.b.node("Concat", {m.batch_size_of("x"), m.ints({-1}),
                                                                        m.b.node("Unsqueeze", {width, m.ints({0})})},
                                                                 {{"axis", int64_t{0}}})});
  EXPECT_TRUE(m.analyze(rows).independent);
  const auto known = runtime::batch_invariant_sizes(m.b.g, runtime::input_batch_axes(m.b.g.inputs));
  ASSERT_TRUE(known.count(width));
  EXPECT_EQ(known.at(width).to_int64_vector(), std::vector<int64_t>{6});
}

// torchvision's ViT: the class token [1, 1, D] expanded to [N, 1, D] through Where(Equal(shape,
// -1), 1, shape), joined to the patches along axis 1, the token read back with Gather.
TEST(SampleIndependence, ExpandedClassTokenIsOneCopyPerSample) {
  BatchModel m({2, 3, 4});
  const std::string shape = m.b.node("Concat", {m.batch_size_of("x"), m.ints({-1}), m.ints({-1})}, {{"axis", int64_t{0}}});
  const std::string ones =
      m.b.node("ConstantOfShape", {m.b.node("Shape", {shape})}, {{"value", Tensor::from_vector<int64_t>({1}, {1})}});
  const std::string is_free = m.b.node("Equal", {shape, m.b.node("Mul", {ones, m.scalar(-1)})});
  const std::string target = m.b.node("Where", {is_free, ones, shape});
  const std::string token = m.b.node("Expand", {m.floats({1, 1, 4}), target});
  const std::string joined = m.b.node("Concat", {token, "x"}, {{"axis", int64_t{1}}});
  const std::string first = m.b.node("Gather", {joined, m.scalar(0)}, {{"axis", int64_t{1}}});
  const auto r = m.analyze(m.b.node("LayerNormalization", {first, m.floats({4}), m.floats({4})}));
  EXPECT_TRUE(r.independent) << r.reason;

  BatchModel fixed({2, 3, 4});  // expanded to a fixed 2: its own size along the batch axis
  const std::string token2 = fixed.b.node("Expand", {fixed.floats({1, 1, 4}), fixed.ints({2, 1, 4})});
  expect_samples_mixed(fixed.analyze(fixed.b.node("Concat", {token2, "x"}, {{"axis", int64_t{1}}})), "joins a batch");
}

// PP-OCR's attention: heads split by a Reshape copying the batch, Transpose [2, 0, 3, 1, 4] moving
// it to axis 1, q / k / v sliced and squeezed along axis 0, batched MatMuls, Softmax (opset 11:
// the rows are the axes before `axis`).
TEST(SampleIndependence, TransposedAttentionHeadsKeepTheBatchWhereverItMoves) {
  BatchModel m({2, 5, 12}, 11);
  const std::string heads = m.b.node("Reshape", {"x", m.ints({0, -1, 3, 2, 2})});
  const std::string qkv = m.b.node("Transpose", {heads}, {{"perm", std::vector<int64_t>{2, 0, 3, 1, 4}}});
  auto part = [&](int64_t i) {
    const std::string s = m.b.node("Slice", {qkv, m.ints({i}), m.ints({i + 1}), m.ints({0})});
    return m.b.node("Squeeze", {s}, {{"axes", std::vector<int64_t>{0}}});
  };
  const std::string q = part(0), k = part(1), v = part(2);
  const std::string kt = m.b.node("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  const std::string att = m.b.node("Softmax", {m.b.node("MatMul", {q, kt})}, {{"axis", int64_t{3}}});
  const std::string out = m.b.node("Transpose", {m.b.node("MatMul", {att, v})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const std::string merged = m.b.node("Reshape", {out, m.ints({0, -1, 4})});
  const auto r = m.analyze(m.b.node("MatMul", {merged, m.floats({4, 7})}));
  EXPECT_TRUE(r.independent) << r.reason;

  BatchModel coerced({2, 5, 12}, 11);  // opset 11, axis 0: one softmax over everything
  expect_samples_mixed(coerced.analyze(coerced.b.node("Softmax", {"x"}, {{"axis", int64_t{0}}})), "across the batch");
}

// PyTorch's F.pad with amounts computed from the input's sizes ((7 - W % 7) % 7, as Swin pads to
// whole windows): the amounts as one vector, zeros appended, Reshape to [-1, 2], Slice backwards,
// Transpose, Reshape to [-1]; then the attention dropout as exported, training mode with ratio 0.
TEST(SampleIndependence, PadAmountsComputedFromSizesAreFollowed) {
  BatchModel m({2, 5, 10});
  (*m.b.g.inputs[0].dims)[1] = ir::Dim{5, ""};
  (*m.b.g.inputs[0].dims)[2] = ir::Dim{10, ""};
  const std::string width = m.b.node("Gather", {m.b.node("Shape", {"x"}), m.scalar(2)}, {{"axis", int64_t{0}}});
  const std::string extra = m.b.node("Mod", {m.b.node("Sub", {m.scalar(7), m.b.node("Mod", {width, m.scalar(7)})}), m.scalar(7)});
  const std::string amounts = m.b.node("Concat", {m.ints({0}), m.b.node("Unsqueeze", {extra, m.ints({0})}), m.ints({0, 0, 0, 0})},
                                       {{"axis", int64_t{0}}});  // (left, right) for the last axis first
  const std::string pairs = m.b.node("Reshape", {amounts, m.ints({-1, 2})});
  const int64_t lowest = std::numeric_limits<int64_t>::min() + 1;
  const std::string reversed = m.b.node("Slice", {pairs, m.ints({-1}), m.ints({lowest}), m.ints({0}), m.ints({-1})});
  const std::string pads = m.b.node("Reshape", {m.b.node("Transpose", {reversed}, {{"perm", std::vector<int64_t>{1, 0}}}), m.ints({-1})});
  const std::string padded = m.b.node("Pad", {"x", pads});  // [N, 5, 14]
  Tensor no(DType::kBool, {});
  no.data<bool>()[0] = true;
  const std::string dropped = m.b.node("Dropout", {padded, m.b.constant(Tensor::scalar<float>(0.f)), m.b.constant(no)});
  // Its size is followed: [N, 5, 14] -> [N * 5, 2, 7] (windows of 7 stacked with the batch) and back.
  const std::string windows = m.b.node("Reshape", {dropped, m.ints({-1, 2, 7})});
  const auto r = m.analyze(m.b.node("Reshape", {m.b.node("Softmax", {windows}, {{"axis", int64_t{-1}}}), m.ints({-1, 5, 14})}));
  EXPECT_TRUE(r.independent) << r.reason;

  BatchModel training({2, 5, 10});
  const std::string dropped2 = training.b.node("Dropout", {"x", training.b.constant(Tensor::scalar<float>(0.1f)), training.b.constant(no)});
  expect_samples_mixed(training.analyze(dropped2), "training mode");
}

TEST(SampleIndependence, RecurrentLayersCarryTheBatchOnTheirSecondAxis) {
  BatchModel m({2, 5, 3});  // [N, T, C] -> [T, N, C] for an LSTM of layout 0
  const std::string seq = m.b.node("Transpose", {"x"}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  ir::Node lstm;
  lstm.op_type = "LSTM";
  lstm.name = "lstm";
  lstm.inputs = {seq, m.floats({1, 16, 3}), m.floats({1, 16, 4}), m.floats({1, 32})};
  lstm.outputs = {"y", "y_h"};
  lstm.attrs["hidden_size"] = int64_t{4};
  m.b.g.nodes.push_back(lstm);
  m.b.g.outputs = {test::float_value("y", {}), test::float_value("y_h", {})};
  const auto r = analyze_sample_independence(m.b.g, runtime::input_batch_axes(m.b.g.inputs));
  ASSERT_TRUE(r.independent) << r.reason;
  EXPECT_EQ(r.output_axes.at("y"), 2u);
  EXPECT_EQ(r.output_axes.at("y_h"), 1u);
}

TEST(SampleIndependence, OpsOverTheBatchAxisAreNamed) {
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("ReduceMean", {"x"}, {{"axes", std::vector<int64_t>{0}}})), "ReduceMean");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("ReduceSum", {"x"})), "every axis");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("Softmax", {"x"}, {{"axis", int64_t{0}}})), "across the batch");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("Concat", {"x", m.floats({1, 4})}, {{"axis", int64_t{0}}})), "joins");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("Concat", {"x", "x"}, {{"axis", int64_t{0}}})), "along the batch axis");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("Gather", {"x", m.ints({0, 2})}, {{"axis", int64_t{0}}})), "along the batch axis");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("Slice", {"x", m.ints({0}), m.ints({1}), m.ints({0})})), "slices the batch axis");
  }
  {
    BatchModel m({3, 4});  // the whole batch axis: kept
    const int64_t end = std::numeric_limits<int64_t>::max();
    const auto r = m.analyze(m.b.node("Slice", {"x", m.ints({0, 1}), m.ints({end, 3}), m.ints({0, 1})}));
    EXPECT_TRUE(r.independent) << r.reason;
  }
  {
    BatchModel m({3, 4});  // a weight with its own first axis of 3: the batch of 3 baked in
    expect_samples_mixed(m.analyze(m.b.node("Add", {"x", m.floats({3, 4})})), "own size along the batch axis");
  }
  {
    BatchModel m({3, 2, 4, 4});
    std::string bn = m.b.node("BatchNormalization", {"x", m.floats({2}), m.floats({2}), m.floats({2}), m.floats({2})},
                              {{"training_mode", int64_t{1}}});
    expect_samples_mixed(m.analyze(bn), "training mode");
  }
  {
    BatchModel m({3, 4});  // [4, N]: the batch on the second axis
    const auto kept = m.analyze(m.b.node("Transpose", {"x"}));
    ASSERT_TRUE(kept.independent) << kept.reason;
    EXPECT_EQ(kept.output_axes.begin()->second, 1u);
    BatchModel t({3, 4});  // [4, N]: the batch last, then a MatMul contracting it
    const auto r = t.analyze(t.b.node("MatMul", {t.b.node("Transpose", {"x"}), t.floats({3, 2})}));
    expect_samples_mixed(r, "contracts the batch axis");
  }
  {
    BatchModel m({3, 4});
    expect_samples_mixed(m.analyze(m.b.node("NonZero", {"x"})), "NonZero");
  }
  {
    BatchModel m({3, 4});  // no batch axis in the output: a constant of the right size
    m.b.node("Relu", {"x"});
    expect_samples_mixed(m.analyze(m.floats({1, 4})), "no batch axis");
  }
}

// A session runs a batch of an independent model in parts (here a fixed 2, the last part 1) with
// the whole batch's outputs, the LSTM's joined along their batch axes; a model that mixes samples
// runs whole.
TEST(SampleIndependence, SessionRunsABatchInPartsWithTheWholeBatchsOutputs) {
  BatchModel m({5, 6, 3});
  (*m.b.g.inputs[0].dims)[1] = ir::Dim{-1, "steps"};
  std::mt19937 rng(3);
  const std::string seq = m.b.node("Transpose", {"x"}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  ir::Node lstm;
  lstm.op_type = "LSTM";
  lstm.name = "lstm";
  lstm.inputs = {seq, m.b.constant(test::random_tensor({1, 16, 3}, rng)), m.b.constant(test::random_tensor({1, 16, 4}, rng))};
  lstm.outputs = {"y", "y_h"};
  lstm.attrs["hidden_size"] = int64_t{4};
  m.b.g.nodes.push_back(lstm);
  const std::string pooled = m.b.node("ReduceMean", {"y"}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}});
  m.b.g.outputs = {test::float_value("y", {}), test::float_value("y_h", {}), test::float_value(pooled, {})};
  for (auto& o : m.b.g.outputs) o.dims.reset();

  runtime::SessionOptions whole_options;
  whole_options.split_batches = false;
  runtime::Session whole(m.b.g, whole_options);
  EXPECT_FALSE(whole.samples_independent());
  runtime::SessionOptions in_pairs;
  in_pairs.samples_per_part = 2;
  runtime::Session parts(m.b.g, in_pairs);
  ASSERT_TRUE(parts.samples_independent()) << parts.samples_dependence();
  // 16 steps: parts read rows of x in place (384 bytes a pair); 6 steps: copied (144 bytes).
  for (const int64_t steps : {16, 6}) {
    const Tensor x = test::random_tensor({5, steps, 3}, rng);
    const auto want = whole.run({{"x", x}});
    const auto got = parts.run({{"x", x}});
    for (const auto& [name, t] : want) {
      ASSERT_EQ(got.at(name).shape(), t.shape()) << name;
      const auto a = t.to_float_vector(), b = got.at(name).to_float_vector();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6f) << name << " " << i;
    }
  }

  BatchModel mixing({5, 4});
  mixing.b.g.outputs = {test::float_value(mixing.b.node("Softmax", {"x"}, {{"axis", int64_t{0}}}), {})};
  runtime::Session s(mixing.b.g, in_pairs);
  EXPECT_FALSE(s.samples_independent());
  EXPECT_NE(s.samples_dependence().find("Softmax"), std::string::npos) << s.samples_dependence();
  const Tensor y = s.run({{"x", test::random_tensor({5, 4}, rng)}}).begin()->second;
  float column_sum = 0;
  for (int64_t r = 0; r < 5; ++r) column_sum += y.data<float>()[r * 4];
  EXPECT_NEAR(column_sum, 1.f, 1e-5f);  // one softmax over all five samples, not over parts
}

}  // namespace

namespace {

// Runs `batch` through the choice `runs` times, each run's time per sample given by the size the
// choice asked for; returns the sizes asked for.
std::vector<int64_t> run_choice(runtime::PartChoice& c, int64_t batch, const std::map<int64_t, std::vector<double>>& per_sample) {
  std::vector<int64_t> asked;
  std::map<int64_t, size_t> used;
  while (c.choosing(batch)) {
    const int64_t part = c.next(batch);
    asked.push_back(part);
    c.note(batch, per_sample.at(part).at(used[part]++) * static_cast<double>(batch));
  }
  return asked;
}

TEST(PartChoice, TheSmallerSizeWinsOnlyWhenItsFastestTimedRunIsClearlyFaster) {
  // Untimed first runs (100 s: plans being made) do not count; each size's fastest timed run does.
  runtime::PartChoice faster{8, 2};
  EXPECT_EQ(run_choice(faster, 32, {{8, {100, 1.0, 0.9}}, {2, {100, 0.85, 1.2}}}), (std::vector<int64_t>{8, 2, 8, 2, 8, 2}));
  EXPECT_EQ(faster.next(32), 2);  // 0.85 < 0.97 * 0.9
  EXPECT_FALSE(faster.choosing(32));

  runtime::PartChoice level{8, 2};
  run_choice(level, 32, {{8, {100, 1.0, 0.9}}, {2, {100, 0.88, 0.95}}});
  EXPECT_EQ(level.next(32), 8);  // 0.88 is within 3% of 0.9: the rule's size stays
  EXPECT_EQ(level.candidate, 0);

  // At a batch both sizes take whole, nothing is timed and the choice waits for a larger batch.
  runtime::PartChoice waiting{8, 2};
  EXPECT_FALSE(waiting.choosing(2));
  EXPECT_EQ(waiting.next(2), 2);
  waiting.note(2, 1.0);
  EXPECT_EQ(waiting.runs, 0);
  EXPECT_TRUE(waiting.choosing(4));  // whole (4) against parts of 2
  EXPECT_EQ(waiting.next(4), 4);
}

// The choice says while it is timing: after its first run and until it decides.
TEST(PartChoice, SettlingFromTheFirstRunUntilTheDecision) {
  runtime::PartChoice c{8, 2};
  EXPECT_FALSE(c.settling());
  c.note(32, 1.0);
  EXPECT_TRUE(c.settling());
  run_choice(c, 32, {{8, {1.0, 0.9}}, {2, {100, 0.95, 0.93}}});
  EXPECT_FALSE(c.settling());
  EXPECT_EQ(c.next(32), 8);
}

}  // namespace
