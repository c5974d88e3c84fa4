// The squeeze-excitation / FPN ops of PP-OCRv4 det (GlobalAveragePool / GlobalMaxPool, the
// per-channel gate Mul, the Add with a folded nearest upsampling and per-channel Q, nearest Resize,
// Concat with a folded per-channel Q, a standalone per-channel QuantizeLinear) read and write the
// convolutions' channel-blocked layouts (acdb from the int8 convolutions, aBcd16b / aBcd8b from the
// FP32 ones). Every value must be bit-identical to the plain-layout run of the same graph
// (SessionOptions::blocked_layouts = false), in float and in int8, and the chain must actually stay
// blocked (a hook that accepts any layout sees the values in another order than the plain ones).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <random>
#include <string>

#include "graph_builder.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

constexpr int64_t kIn = 8, kSize = 16;

// Names of the values the tests look at.
struct Det {
  ir::Graph g;
  std::string conv, gate_mul, se, small, upsampled_sum, head_conv, concat;
};

// x [N, 8, 16, 16] -> c1 = Conv 3x3 -> SE: c1 * HardSigmoid(Conv(Relu(Conv(GAP(c1))))) + c1;
// d = Conv 3x3 stride 2 [N, C, 8, 8] -> d * GlobalMaxPool(d); the FPN sum se + Resize(d', x2) ->
// head; Resize(d', x2), that head and head(se) concatenated along the channels -> head -> y.
// The heads are convolutions (1x1 for y), or with `pool_heads` 3x3 MaxPools, which are exact in
// every layout (an FP32 convolution may round differently for a blocked and a plain input, which
// would hide what the ops between them do).
Det det_like_graph(int64_t channels, bool pool_heads) {
  std::mt19937 rng(3);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  auto weight = [&](int64_t cout, int64_t cin, int64_t k) {
    return b.constant(test::random_tensor({cout, cin, k, k}, rng, -0.3f, 0.3f));
  };
  auto conv = [&](const std::string& in, int64_t cin, int64_t cout, int64_t k, int64_t stride = 1) {
    return b.node("Conv", {in, weight(cout, cin, k), b.constant(test::random_tensor({cout}, rng))},
                  {{"pads", std::vector<int64_t>(4, k / 2)}, {"strides", std::vector<int64_t>{stride, stride}}});
  };
  auto resize_by_2 = [&](const std::string& in) {
    return b.node("Resize", {in, "", b.constant(Tensor::from_vector<float>({4}, {1, 1, 2, 2}))},
                  {{"mode", std::string("nearest")},
                   {"coordinate_transformation_mode", std::string("asymmetric")},
                   {"nearest_mode", std::string("floor")}});
  };
  auto head = [&](const std::string& in, int64_t cin, int64_t cout, int64_t k) {
    if (!pool_heads) return conv(in, cin, cout, k);
    return b.node("MaxPool", {in}, {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>(4, 1)}});
  };
  Det d;
  d.conv = conv("x", kIn, channels, 3);
  const std::string pooled = b.node("GlobalAveragePool", {d.conv});
  const std::string squeezed = b.node("Relu", {conv(pooled, channels, 8, 1)});
  const std::string gate = b.node("HardSigmoid", {conv(squeezed, 8, channels, 1)},
                                  {{"alpha", 0.2f}, {"beta", 0.5f}});
  d.gate_mul = b.node("Mul", {d.conv, gate});
  d.se = b.node("Add", {d.conv, d.gate_mul});
  const std::string down = conv("x", kIn, channels, 3, 2);
  d.small = b.node("Mul", {down, b.node("GlobalMaxPool", {down})});
  d.upsampled_sum = b.node("Add", {d.se, resize_by_2(d.small)});
  d.head_conv = head(d.upsampled_sum, channels, channels, 3);
  d.concat = b.node("Concat", {resize_by_2(d.small), d.head_conv, head(d.se, channels, channels, 1)},
                    {{"axis", int64_t{1}}});
  const std::string y = head(d.concat, 3 * channels, 4, 1);
  b.g.outputs.push_back({y, DType::kFloat32, std::nullopt});
  d.g = b.g;
  return d;
}

Tensor input(int64_t batch, uint32_t seed, int64_t channels = kIn) {
  std::mt19937 rng(seed);
  return test::random_tensor({batch, channels, kSize, kSize}, rng, -2.f, 2.f);
}

// Two convolutions of x, each read by a GlobalAveragePool and (through a per-channel Q) by a
// convolution: two standalone per-channel QuantizeLinear of the same channel count, one after
// the other, on channels-last data (their parameters must not mix).
ir::Graph two_quantized_branches(int64_t channels) {
  std::mt19937 rng(4);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  auto conv = [&](const std::string& in, int64_t cin, int64_t cout) {
    return b.node("Conv", {in, b.constant(test::random_tensor({cout, cin, 3, 3}, rng, -0.3f, 0.3f)),
                           b.constant(test::random_tensor({cout}, rng))},
                  {{"pads", std::vector<int64_t>(4, 1)}});
  };
  for (int branch = 0; branch < 2; ++branch) {
    const std::string c = conv("x", kIn, channels);
    b.g.outputs.push_back({b.node("GlobalAveragePool", {c}), DType::kFloat32, std::nullopt});
    b.g.outputs.push_back({conv(c, channels, 4), DType::kFloat32, std::nullopt});
  }
  return b.g;
}

// expected_convs: the QConvs after lowering (det_like_graph: 7 Convs, of which the squeeze
// convolution after the quantized squeeze-excitation input's pool stays float, see PTQ).
ir::Graph lowered_int8(const ir::Graph& g, int expected_convs, int64_t in_channels = kIn) {
  quant::PTQ ptq{quant::QuantConfig(quant::QuantRule{"abs_max", "channel_wise_abs_max", true})};
  ptq.quantize(g);
  for (uint32_t seed : {11u, 12u}) ptq.sample({{"x", input(2, seed, in_channels)}});
  ptq.set_channel_wise_conv_inputs(true);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(ptq.convert(), {}, &report);
  EXPECT_EQ(report.conv, expected_convs);
  return lowered;
}

// Every value a run produces, cloned: as plain values, or as held (any_layout).
std::map<std::string, Tensor> run_seen(runtime::Session& s, const Tensor& x, bool any_layout = false) {
  std::map<std::string, Tensor> seen;
  runtime::RunOptions o;
  o.observe_in_any_layout = any_layout;
  o.on_value = [&](const std::string& name, const Tensor& t) { seen[name] = t.clone(); };
  s.run({{"x", x}}, o);
  return seen;
}

// Every value of a run of g with plain layouts only (SessionOptions::blocked_layouts = false).
std::map<std::string, Tensor> run_plain_layout(const ir::Graph& g, const Tensor& x) {
  runtime::SessionOptions plain_options;
  plain_options.blocked_layouts = false;
  runtime::Session plain(g, plain_options);
  return run_seen(plain, x);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs g with blocked layouts on and off: every value the plain run shows must have the same bits
// in the blocked run; returns the blocked run's values as held, for the layout checks.
std::map<std::string, Tensor> expect_bit_identical(const ir::Graph& g, const Tensor& x) {
  runtime::SessionOptions plain_options;
  plain_options.blocked_layouts = false;
  runtime::Session blocked(g), plain(g, plain_options);
  const auto got = run_seen(blocked, x), want = run_seen(plain, x);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    if (!got.count(name)) {
      ADD_FAILURE() << name << " missing from the blocked run";
      continue;
    }
    EXPECT_TRUE(same_bits(got.at(name), t)) << name << " differs from the plain-layout run";
  }
  return run_seen(blocked, x, /*any_layout=*/true);
}

// A value held in a channel-blocked layout shows its elements in another order than plain.
void expect_held_blocked(const std::map<std::string, Tensor>& held, const std::map<std::string, Tensor>& plain,
                         const std::string& name) {
  ASSERT_TRUE(held.count(name)) << name;
  EXPECT_FALSE(same_bits(held.at(name), plain.at(name))) << name << " was not kept in a blocked layout";
}

TEST(ChannelBlockedOps, FloatChainMatchesThePlainLayoutBitForBit) {
  // 32 channels fill aBcd16b (AVX-512) and aBcd8b (AVX2) blocks, so the FP32 convolutions'
  // outputs stay blocked; MaxPool heads read the chain's results in their blocked layout too.
  const Det d = det_like_graph(32, /*pool_heads=*/true);
  for (int64_t batch : {1, 2}) {
    const Tensor x = input(batch, 5);
    const auto held = expect_bit_identical(d.g, x);
    const auto plain_values = run_plain_layout(d.g, x);
    // The SE block's input, its gated result, the FPN sum and the Concat stay blocked.
    for (const std::string& v : {d.conv, d.small, d.concat}) expect_held_blocked(held, plain_values, v);
    for (const std::string& v : {d.gate_mul, d.se, d.upsampled_sum})
      if (held.count(v)) expect_held_blocked(held, plain_values, v);  // some are fused away
  }
}

// Rows longer than one chunk of the channel-blocked loops, with tails: 24 channels-last lanes go
// in chunks of 80 pixels (quantizer tiles of 8), so a 102-pixel row is 80 + 16 + a 6-pixel tail,
// and the quantized Concat's 72 channels in runs of 40 pixels (612 = 15 * 40 + 12); 32 channels
// in aBcd16b / aBcd8b go in chunks of 128 / 256 pixels (300 = 128 + 128 + 44, or 256 + 44).
TEST(ChannelBlockedOps, RowsOfSeveralChunksWithTailsMatchThePlainLayoutBitForBit) {
  std::mt19937 rng(31);
  const ir::Graph lowered = lowered_int8(det_like_graph(24, /*pool_heads=*/false).g, 6);
  expect_bit_identical(lowered, test::random_tensor({1, kIn, 6, 102}, rng, -2.f, 2.f));
  expect_bit_identical(det_like_graph(32, /*pool_heads=*/true).g, test::random_tensor({1, kIn, 4, 300}, rng, -2.f, 2.f));
}

TEST(ChannelBlockedOps, Int8ChainMatchesThePlainLayoutBitForBit) {
  // 24 channels: not a multiple of 16, but the int8 convolutions write channels-last (acdb).
  const Det d = det_like_graph(24, /*pool_heads=*/false);
  const ir::Graph lowered = lowered_int8(d.g, 6);
  for (int64_t batch : {1, 2}) {
    const Tensor x = input(batch, 21);
    const auto held = expect_bit_identical(lowered, x);
    const auto plain_values = run_plain_layout(lowered, x);
    // The QConvs' float outputs read by the SE / FPN ops stay channels-last, and so do the int8
    // codes the folded per-channel Qs write for the next QConvs.
    size_t blocked = 0, compared = 0;
    for (const auto& [name, t] : plain_values) {
      // Not the graph input and its codes (x, x_cq: plain), nor the output, nor [N, C, 1, 1] values.
      if (t.rank() != 4 || t.dim(2) * t.dim(3) == 1 || name.rfind("x", 0) == 0 || name == lowered.outputs[0].name)
        continue;
      ++compared;
      blocked += !same_bits(held.at(name), t);
    }
    EXPECT_GE(compared, 8u);
    EXPECT_EQ(blocked, compared) << "every rank-4 map between the convolutions stays channels-last";
  }
  const ir::Graph branches = lowered_int8(two_quantized_branches(24), 4);
  for (int64_t batch : {1, 2}) expect_bit_identical(branches, input(batch, 22));
}

// DBNet's head: Conv -> Relu -> ConvTranspose(2x2, stride 2) -> Relu -> ConvTranspose(2x2, stride 2)
// -> Sigmoid. Lowered, each ConvTranspose is a 1x1 QConv and a DepthToSpace; the first DepthToSpace
// moves the QConv's codes, channels-last (int8 primitives) or in 8/16-channel blocks (the exact f32
// path without VNNI), into the same layout for the next QConv (no reorder); the last one (one
// output channel) writes plain values. Bit-identical to the plain layouts.
TEST(ChannelBlockedOps, DepthToSpaceOfKernelSizedConvTransposeStaysChannelsLast) {
  std::mt19937 rng(8);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  const std::string c = b.node("Conv", {"x", b.constant(test::random_tensor({24, kIn, 3, 3}, rng, -0.3f, 0.3f)),
                                        b.constant(test::random_tensor({24}, rng))},
                               {{"pads", std::vector<int64_t>(4, 1)}});
  const std::vector<int64_t> two{2, 2};
  const std::string up = b.node("ConvTranspose", {b.node("Relu", {c}), b.constant(test::random_tensor({24, 16, 2, 2}, rng, -0.3f, 0.3f)),
                                                  b.constant(test::random_tensor({16}, rng))},
                                {{"strides", two}});
  const std::string head = b.node("ConvTranspose", {b.node("Relu", {up}), b.constant(test::random_tensor({16, 1, 2, 2}, rng, -0.3f, 0.3f))},
                                  {{"strides", two}});
  b.g.outputs.push_back({b.node("Sigmoid", {head}), DType::kFloat32, std::nullopt});
  const ir::Graph lowered = lowered_int8(b.g, 3);
  std::vector<std::string> moved;
  for (const ir::Node& n : lowered.nodes)
    if (n.op_type == "DepthToSpace") moved.push_back(n.outputs[0]);
  ASSERT_EQ(moved.size(), 2u);
  for (int64_t batch : {1, 2}) {
    const Tensor x = input(batch, 23);
    const auto held = expect_bit_identical(lowered, x);
    const auto plain_values = run_plain_layout(lowered, x);
    EXPECT_EQ(plain_values.at(moved[0]).dtype(), DType::kUInt8);
    expect_held_blocked(held, plain_values, moved[0]);
    EXPECT_EQ(plain_values.at(moved[1]).shape(), (Shape{batch, 1, 4 * kSize, 4 * kSize}));
  }
}

// An RGB image quantized for the first QConv: the QuantizeLinear writes its codes channels-last,
// the layout the int8 convolution computes in, so the convolution does not reorder them.
TEST(ChannelBlockedOps, QuantizedImageIsWrittenChannelsLastForTheFirstQConv) {
  std::mt19937 rng(9);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  const std::string stem = b.node("Conv", {"x", b.constant(test::random_tensor({16, 3, 3, 3}, rng, -0.3f, 0.3f)),
                                           b.constant(test::random_tensor({16}, rng))},
                                  {{"pads", std::vector<int64_t>(4, 1)}, {"strides", std::vector<int64_t>{2, 2}}});
  const std::string head = b.node("Conv", {b.node("Relu", {stem}), b.constant(test::random_tensor({8, 16, 1, 1}, rng, -0.3f, 0.3f))});
  b.g.outputs.push_back({head, DType::kFloat32, std::nullopt});
  const ir::Graph lowered = lowered_int8(b.g, 2, 3);
  std::string image_codes;
  for (const ir::Node& n : lowered.nodes)
    if (n.op_type == "QuantizeLinear" && n.inputs[0] == "x") image_codes = n.outputs[0];
  ASSERT_FALSE(image_codes.empty());
  for (int64_t batch : {1, 2}) {
    const Tensor x = input(batch, 31, 3);
    const auto held = expect_bit_identical(lowered, x);
    expect_held_blocked(held, run_plain_layout(lowered, x), image_codes);
  }
}


// The squeeze-excitation input: quantized for its pool, gate Mul and residual Add (PTQ's rule for
// our runtime), so the lowered graph has one DequantizeLinear of the QConv's codes that only they
// read; the plan folds it into them (hooks do not see its float32 map). Blocked and plain runs
// agree bit for bit, and the output stays within rounding of the run without execution fusions
// (which computes x + x * gate where the fused plan computes x * (1 + gate)).
TEST(ChannelBlockedOps, SqueezeExcitationInputIsReadAsCodes) {
  const Det d = det_like_graph(24, /*pool_heads=*/false);
  const ir::Graph lowered = lowered_int8(d.g, 6);
  // The QConv outputs dequantized for float readers, by the op types reading them. Besides the SE
  // input, the generic rule (every reader takes codes) also quantizes `down` for its GlobalMaxPool
  // and the Mul it gates.
  std::multiset<std::multiset<std::string>> reader_sets;
  std::string dequantized;
  for (const ir::Node& n : lowered.nodes) {
    if (n.op_type != "DequantizeLinear" || lowered.producer(n.inputs[0]) < 0 ||
        lowered.nodes[static_cast<size_t>(lowered.producer(n.inputs[0]))].op_type != "QConv")
      continue;
    std::multiset<std::string> readers;
    for (int r : lowered.consumers(n.outputs[0])) readers.insert(lowered.nodes[static_cast<size_t>(r)].op_type);
    if (readers.count("GlobalAveragePool")) dequantized = n.outputs[0];
    reader_sets.insert(readers);
  }
  ASSERT_FALSE(dequantized.empty()) << "the SE input is not quantized";
  EXPECT_EQ(reader_sets, (std::multiset<std::multiset<std::string>>{{"Add", "GlobalAveragePool", "Mul"},
                                                                     {"GlobalMaxPool", "Mul"}}));
  // The squeeze convolution reads the pooled vector in float (no per-channel Q after the pool,
  // which ONNX Runtime's QLinearGlobalAveragePool could not run).
  for (const ir::Node& n : lowered.nodes) {
    if (n.op_type != "GlobalAveragePool") continue;
    for (int r : lowered.consumers(n.outputs[0])) EXPECT_EQ(lowered.nodes[static_cast<size_t>(r)].op_type, "Conv");
  }

  runtime::SessionOptions unfused_options;
  unfused_options.fuse_activations = false;
  for (int64_t batch : {1, 2}) {
    const Tensor x = input(batch, 41);
    runtime::Session fused(lowered), unfused(lowered, unfused_options);
    const auto got = run_seen(fused, x), want = run_seen(unfused, x);
    EXPECT_FALSE(got.count(dequantized)) << "the DequantizeLinear was not folded into its readers";
    EXPECT_TRUE(want.count(dequantized));
    const std::string& y = lowered.outputs[0].name;
    const Tensor &g = got.at(y), &w = want.at(y);
    ASSERT_EQ(g.shape(), w.shape());
    float largest = 0.f, worst = 0.f;
    for (int64_t i = 0; i < w.numel(); ++i) {
      largest = std::max(largest, std::fabs(w.data<float>()[i]));
      worst = std::max(worst, std::fabs(g.data<float>()[i] - w.data<float>()[i]));
    }
    EXPECT_LE(worst, 0.02f * largest);
    expect_bit_identical(lowered, x);
  }
}

// x = Conv(in) [N, 32, 8, 8] (aBcd16b / aBcd8b FP32 output), gate = Sigmoid(GlobalAveragePool(x)),
// y = x * gate + Resize(Conv stride 2 (in), x2), then a per-tensor Q: the PP-OCRv4 det FPN's gated
// sum. With `codes`, x passes a QuantizeLinear / DequantizeLinear first, as the squeeze-excitation
// input of a quantized model does.
ir::Graph gated_fpn_sum(bool codes) {
  std::mt19937 rng(14);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  auto conv = [&](int64_t stride) {
    return b.node("Conv", {"x", b.constant(test::random_tensor({32, kIn, 3, 3}, rng, -0.3f, 0.3f))},
                  {{"pads", std::vector<int64_t>(4, 1)}, {"strides", std::vector<int64_t>{stride, stride}}});
  };
  auto qdq = [&](const std::string& v, bool dequantize) {
    const std::string scale = b.constant(Tensor::scalar<float>(0.02f));
    const std::string zero_point = b.constant(Tensor::scalar<uint8_t>(uint8_t{120}));
    const std::string q = b.node("QuantizeLinear", {v, scale, zero_point});
    return dequantize ? b.node("DequantizeLinear", {q, scale, zero_point}) : q;
  };
  std::string x = conv(1);
  if (codes) x = qdq(x, true);
  const std::string gate = b.node("Sigmoid", {b.node("GlobalAveragePool", {x})});
  const std::string up = b.node("Resize", {conv(2), "", b.constant(Tensor::from_vector<float>({4}, {1, 1, 2, 2}))},
                                {{"mode", std::string("nearest")},
                                 {"coordinate_transformation_mode", std::string("asymmetric")},
                                 {"nearest_mode", std::string("floor")}});
  const std::string sum = b.node("Add", {b.node("Mul", {x, gate}), up});
  b.g.outputs.push_back({qdq(sum, false), DType::kUInt8, std::nullopt});
  b.g.outputs.push_back({gate, DType::kFloat32, std::nullopt});
  return b.g;
}

// The gate Mul folded into the FPN sum (and with codes the DequantizeLinear into the pool and the
// sum): one pass, the same bits as the Mul, the Add (and the DequantizeLinear and the pool on
// floats) run apart, blocked and plain.
TEST(ChannelBlockedOps, GatedFpnSumIsOnePassWithTheSameBits) {
  runtime::SessionOptions unfused_options;
  unfused_options.fuse_activations = false;
  for (bool codes : {false, true}) {
    const ir::Graph g = gated_fpn_sum(codes);
    for (int64_t batch : {1, 2}) {
      const Tensor x = input(batch, 43);
      runtime::Session fused(g), unfused(g, unfused_options);
      const auto got = run_seen(fused, x), want = run_seen(unfused, x);
      for (const ir::Node& n : g.nodes) {
        if (n.op_type == "Mul" || n.op_type == "DequantizeLinear") {
          EXPECT_FALSE(got.count(n.outputs[0])) << n.op_type << " was not folded (codes " << codes << ")";
        }
      }
      for (const ir::ValueInfo& out : g.outputs)
        EXPECT_TRUE(same_bits(got.at(out.name), want.at(out.name))) << out.name << " (codes " << codes << ")";
      expect_bit_identical(g, x);
    }
  }
}

// PTQ quantizes a squeeze-excitation input for its gating only when the pool and gating are all
// that read it: another reader (here a Relu) keeps it float32 for every reader.
TEST(ChannelBlockedOps, SqueezeExcitationInputWithAnotherReaderStaysFloat) {
  std::mt19937 rng(12);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  const std::string c = b.node("Conv", {"x", b.constant(test::random_tensor({16, kIn, 3, 3}, rng, -0.3f, 0.3f))},
                               {{"pads", std::vector<int64_t>(4, 1)}});
  const std::string gate = b.node("Sigmoid", {b.node("GlobalAveragePool", {c})});
  const std::string gated = b.node("Mul", {c, gate});
  b.g.outputs.push_back({b.node("Conv", {gated, b.constant(test::random_tensor({4, 16, 1, 1}, rng))}), DType::kFloat32,
                         std::nullopt});
  auto quantized_for_gate = [](const ir::Graph& g) {
    quant::PTQ ptq{quant::QuantConfig(quant::QuantRule{"abs_max", "channel_wise_abs_max", true})};
    ptq.quantize(g);
    ptq.sample({{"x", input(1, 13)}});
    const ir::Graph q = ptq.convert();
    for (const ir::Node& n : q.nodes)
      if (n.op_type == "GlobalAveragePool") return q.producer(n.inputs[0]) >= 0 &&
                                                   q.nodes[static_cast<size_t>(q.producer(n.inputs[0]))].op_type ==
                                                       "DequantizeLinear";
    return false;
  };
  EXPECT_TRUE(quantized_for_gate(b.g));
  b.g.outputs.push_back({b.node("Relu", {c}), DType::kFloat32, std::nullopt});
  EXPECT_FALSE(quantized_for_gate(b.g));
}
}  // namespace

// A U-Net decoder's bilinear upsampling between convolutions: Resize (linear) by 2 (half_pixel) and
// to a size that is not a multiple (align_corners, 8x8 -> 13x19) reads and writes the
// convolutions' blocked layout (aBcd16b / aBcd8b in float, channels-last in int8), bit for bit the
// plain-layout run's values.
TEST(ChannelBlockedOps, BilinearResizeKeepsTheLayoutWithTheSameBits) {
  for (const int64_t batch : {1, 2}) {
    for (const bool to_size : {false, true}) {
      for (const bool int8 : {false, true}) {
        SCOPED_TRACE(std::string(int8 ? "int8" : "float") + (to_size ? ", to a size" : ", by 2") + ", batch " +
                     std::to_string(batch));
        std::mt19937 rng(41);
        test::GraphBuilder b;
        b.g.opset = 13;
        b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
        const int64_t channels = int8 ? 24 : 32;
        auto conv = [&](const std::string& in, int64_t cin, int64_t cout, int64_t stride) {
          return b.node("Conv", {in, b.constant(test::random_tensor({cout, cin, 3, 3}, rng, -0.3f, 0.3f)),
                                 b.constant(test::random_tensor({cout}, rng))},
                        {{"pads", std::vector<int64_t>(4, 1)}, {"strides", std::vector<int64_t>{stride, stride}}});
        };
        const std::string down = conv("x", kIn, channels, 2);
        const Tensor sizes = Tensor::from_vector<int64_t>({4}, {batch, channels, 13, 19});
        const std::string up =
            to_size ? b.node("Resize", {down, "", "", b.constant(sizes)},
                             {{"mode", std::string("linear")},
                              {"coordinate_transformation_mode", std::string("align_corners")}})
                    : b.node("Resize", {down, "", b.constant(Tensor::from_vector<float>({4}, {1, 1, 2, 2}))},
                             {{"mode", std::string("linear")},
                              {"coordinate_transformation_mode", std::string("half_pixel")}});
        // A pool after it (exact in every layout) and a convolution that reads it.
        const std::string pooled = b.node(
            "MaxPool", {up}, {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>(4, 1)}});
        b.g.outputs.push_back({conv(pooled, channels, 4, 1), DType::kFloat32, std::nullopt});
        const ir::Graph g = int8 ? lowered_int8(b.g, 2) : b.g;
        const Tensor x = input(batch, 43);
        const auto held = expect_bit_identical(g, x);
        const auto plain_values = run_plain_layout(g, x);
        expect_held_blocked(held, plain_values, up);
        ASSERT_EQ(plain_values.at(up).dim(2), to_size ? 13 : 16);
      }
    }
  }
}

// A QuantizeLinear after a Resize folds into it (U-Net and FPN upsampling into a quantized Concat):
// the Resize writes the codes itself, the same codes as Resize then QuantizeLinear. Bilinear on the
// convolution's blocked layout (each row quantized from a buffer in cache), nearest and a plain
// input (the float result, then its codes), u8 and s8.
TEST(ChannelBlockedOps, QuantizeLinearFoldsIntoTheResizeWithTheSameCodes) {
  for (const bool linear : {true, false}) {
    for (const bool after_conv : {true, false}) {
      for (const DType type : {DType::kUInt8, DType::kInt8}) {
        SCOPED_TRACE(std::string(linear ? "linear" : "nearest") + (after_conv ? ", blocked input" : ", plain input") +
                     (type == DType::kUInt8 ? ", u8" : ", s8"));
        std::mt19937 rng(7);
        test::GraphBuilder b;
        b.g.opset = 13;
        b.g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
        const std::string in =
            after_conv ? b.node("Conv", {"x", b.constant(test::random_tensor({32, kIn, 3, 3}, rng, -0.3f, 0.3f)),
                                         b.constant(test::random_tensor({32}, rng))},
                                {{"pads", std::vector<int64_t>(4, 1)}})
                       : "x";
        const std::string up =
            b.node("Resize", {in, "", b.constant(Tensor::from_vector<float>({4}, {1, 1, 2, 2}))},
                   {{"mode", std::string(linear ? "linear" : "nearest")},
                    {"coordinate_transformation_mode", std::string("half_pixel")}});
        Tensor zero_point(type, {});
        if (type == DType::kUInt8) zero_point.data<uint8_t>()[0] = 120;
        else zero_point.data<int8_t>()[0] = -5;
        const std::string codes =
            b.node("QuantizeLinear", {up, b.constant(Tensor::scalar<float>(0.01f)), b.constant(zero_point)});
        b.g.outputs.push_back({codes, type, std::nullopt});
        runtime::SessionOptions unfused_options;
        unfused_options.fuse_activations = false;
        runtime::Session fused(b.g), unfused(b.g, unfused_options);
        const Tensor x = input(2, 9);
        const auto got = run_seen(fused, x), want = run_seen(unfused, x);
        EXPECT_FALSE(got.count(up)) << "the Resize's float32 output should be folded away";
        ASSERT_TRUE(got.count(codes));
        EXPECT_TRUE(same_bits(got.at(codes), want.at(codes)));
        // Both ends of the code range are reached (saturation included).
        const std::vector<float> v = want.at(codes).to_float_vector();
        const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
        EXPECT_EQ(*lo, type == DType::kUInt8 ? 0.f : -128.f);
        EXPECT_EQ(*hi, type == DType::kUInt8 ? 255.f : 127.f);
      }
    }
  }
}
