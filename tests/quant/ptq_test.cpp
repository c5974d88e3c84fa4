#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <set>

#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"
#include "quant/int8_test_util.h"
#include "quant/qdq_export.h"
#include "graph_builder.h"
#include "test_util.h"

using namespace slimquant;

namespace {

ir::Node node(std::string op, std::string name) {
  ir::Node n;
  n.op_type = std::move(op);
  n.name = std::move(name);
  n.inputs = {"x", "w"};
  n.outputs = {n.name + "_out"};
  return n;
}

TEST(QuantConfig, RulePriorityLayerOverNameOverTypeOverGlobal) {
  quant::QuantConfig cfg(quant::QuantRule{"KL", "channel_wise_abs_max", true});
  cfg.add_type_config({"conv2d"}, {"hist", "abs_max", true});      // source name maps to Conv
  cfg.add_name_config({"/layer1/*"}, {"mse", "abs_max", true});
  cfg.add_layer_config({"/layer1/conv2"}, {"emd", "mse_channel_wise", true});
  EXPECT_EQ(cfg.rule_for(node("Gemm", "/fc/Gemm")).activation, "KL");
  EXPECT_EQ(cfg.rule_for(node("Conv", "/stem/conv")).activation, "hist");
  EXPECT_EQ(cfg.rule_for(node("Conv", "/layer1/conv1")).activation, "mse");
  EXPECT_EQ(cfg.rule_for(node("Conv", "/layer1/conv2")).activation, "emd");
  EXPECT_EQ(cfg.rule_for(node("Conv", "/layer1/conv2")).weight, "mse_channel_wise");
}

TEST(QuantConfig, SkipsAndQuantizableTypes) {
  quant::QuantConfig cfg;
  cfg.skip_quant = {"/head/*", "Gemm"};
  cfg.skip_tensor_list = {"special"};
  EXPECT_NE(cfg.spec_for(node("Conv", "/body/conv")), nullptr);
  EXPECT_EQ(cfg.spec_for(node("Conv", "/head/conv")), nullptr);
  EXPECT_EQ(cfg.spec_for(node("Gemm", "/fc")), nullptr);
  auto reads_special = node("Conv", "/body/conv2");
  reads_special.inputs[0] = "special";
  EXPECT_EQ(cfg.spec_for(reads_special), nullptr);
  // A layer (node) name in skip_tensor_list skips that node only (analysis.txt's names, seed 000).
  cfg.skip_tensor_list.push_back("/body/conv3");
  EXPECT_EQ(cfg.spec_for(node("Conv", "/body/conv3")), nullptr);
  EXPECT_NE(cfg.spec_for(node("Conv", "/body/conv4")), nullptr);
  // Add is only quantized with is_full_quantize.
  EXPECT_EQ(cfg.spec_for(node("Add", "/add")), nullptr);
  cfg.is_full_quantize = true;
  EXPECT_NE(cfg.spec_for(node("Add", "/add")), nullptr);
}

TEST(QuantConfig, YamlUsesSourceParameterNamesAndRejectsTypos) {
  test::TempDir tmp("yaml");
  std::ofstream(tmp.path("ptq.yaml")) << "algo: hist\nhist_percent: 0.999\nweight_quantize_type: abs_max\n"
                                         "quantizable_op_type: [conv2d, mul]\nis_full_quantize: true\n"
                                         "skip_tensor_list: [a, b]\nbatch_size: 16\n"
                                         "type_config:\n  Gemm: {algo: mse}\n";
  std::map<std::string, std::string> extra;
  auto cfg = quant::load_quant_config_yaml(tmp.path("ptq.yaml"), quant::QuantConfig(), &extra);
  EXPECT_EQ(cfg.global().activation, "hist");
  EXPECT_FLOAT_EQ(cfg.observer_options.hist_percent, 0.999f);
  EXPECT_EQ(cfg.global().weight, "abs_max");
  EXPECT_TRUE(cfg.is_full_quantize);
  EXPECT_EQ(cfg.skip_tensor_list, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(extra.at("batch_size"), "16");
  EXPECT_EQ(cfg.rule_for(node("Gemm", "fc")).activation, "mse");
  EXPECT_NE(cfg.spec_for(node("MatMul", "mm")), nullptr);  // `mul` maps to MatMul and Gemm

  std::ofstream(tmp.path("typo.yaml")) << "algoo: KL\n";
  try {
    quant::load_quant_config_yaml(tmp.path("typo.yaml"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'algoo'"), std::string::npos) << e.what();
  }
  std::ofstream(tmp.path("bits.yaml")) << "weight_bits: 7\n";
  EXPECT_EQ(quant::load_quant_config_yaml(tmp.path("bits.yaml")).weight_bits, 7);
  std::ofstream(tmp.path("badbits.yaml")) << "weight_bits: 12\n";
  EXPECT_THROW(quant::load_quant_config_yaml(tmp.path("badbits.yaml")), Error);
  std::ofstream(tmp.path("badalgo.yaml")) << "algo: fancy\n";
  EXPECT_THROW(quant::load_quant_config_yaml(tmp.path("badalgo.yaml")), Error);
}

// Found by fuzz_yaml_config: a non-scalar key next to ptq_config escaped as a yaml-cpp exception
// (exit code 1); observer options out of range were accepted until calibration.
// Seed 002's is_full_quantize list: every one of its 25 names is a known quantizable op type, the
// six mapped last to what paddle2onnx writes for them.
TEST(QuantConfig, EverySeedFullQuantizeNameMapsToQuantizableOnnxTypes) {
  const std::vector<std::string> seed_names = {
      "conv2d", "depthwise_conv2d", "mul", "pool2d", "elementwise_add", "concat", "softmax", "argmax", "transpose",
      "equal", "gather", "greater_equal", "greater_than", "less_equal", "less_than", "mean", "not_equal", "reshape",
      "reshape2", "bilinear_interp", "nearest_interp", "trilinear_interp", "slice", "squeeze", "elementwise_sub"};
  quant::QuantConfig cfg;
  cfg.quantizable_op_type = seed_names;
  EXPECT_NO_THROW(cfg.validate());
  const std::map<std::string, std::vector<std::string>> mapped = {
      {"argmax", {"ArgMax"}},
      {"greater_equal", {"GreaterOrEqual", "Less"}},
      {"less_equal", {"LessOrEqual", "Greater"}},
      {"mean", {"ReduceMean"}},
      {"not_equal", {"Equal"}},
      {"trilinear_interp", {"Resize"}}};
  for (const auto& [paddle, onnx] : mapped) {
    EXPECT_EQ(quant::onnx_op_types_for(paddle), onnx) << paddle;
    quant::QuantConfig only;
    only.quantizable_op_type = {paddle};
    EXPECT_NO_THROW(only.validate()) << paddle;
    for (const auto& op : onnx) {
      EXPECT_NE(only.spec_for(node(op, "/n")), nullptr) << paddle << " -> " << op;
      EXPECT_TRUE(only.quantizes_op_type(op)) << op;
    }
    EXPECT_EQ(only.spec_for(node("Conv", "/conv")), nullptr) << paddle;
  }
}

// Paddle's ptq_config values: activation_quantize_type's three Paddle names are fixed symmetric
// scales (what they mean once exported), asymmetric stays asymmetric, anything else names the choices.
TEST(QuantConfig, YamlTakesPaddleActivationQuantizeTypes) {
  test::TempDir tmp("yaml_paddle");
  for (const std::string type : {"moving_average_abs_max", "range_abs_max", "abs_max", "symmetric"}) {
    std::ofstream(tmp.path("a.yaml")) << "ptq_config:\n  activation_quantize_type: " << type
                                      << "\n  activation_bits: 8\n  algo: KL\n";
    quant::QuantConfig base;
    base.asymmetric_activations = true;
    const auto cfg = quant::load_quant_config_yaml(tmp.path("a.yaml"), base);
    EXPECT_FALSE(cfg.asymmetric_activations) << type;
    EXPECT_EQ(cfg.global().activation, "KL");
  }
  std::ofstream(tmp.path("asym.yaml")) << "activation_quantize_type: asymmetric\n";
  EXPECT_TRUE(quant::load_quant_config_yaml(tmp.path("asym.yaml")).asymmetric_activations);
  std::ofstream(tmp.path("bad.yaml")) << "activation_quantize_type: moving_average\n";
  try {
    quant::load_quant_config_yaml(tmp.path("bad.yaml"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("moving_average_abs_max"), std::string::npos) << e.what();
  }
  std::ofstream(tmp.path("bits.yaml")) << "activation_bits: 16\n";
  try {
    quant::load_quant_config_yaml(tmp.path("bits.yaml"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("activation_bits"), std::string::npos) << e.what();
  }
}

TEST(QuantConfig, YamlErrorsAreInvalidArgumentsNamingTheFile) {
  test::TempDir tmp("yaml_errors");
  std::ofstream(tmp.path("key.yaml")) << "ptq_config: {algo: KL}\n? [1, 2]\n: 3\n";
  try {
    quant::load_quant_config_yaml(tmp.path("key.yaml"));
    FAIL() << "a sequence as a key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("config file '" + tmp.path("key.yaml") + "': "), std::string::npos)
        << e.what();
  }
  std::ofstream(tmp.path("bins.yaml")) << "algo: hist\nbins: -5\n";
  try {
    quant::load_quant_config_yaml(tmp.path("bins.yaml"));
    FAIL() << "bins: -5 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bins must be in [16, 4194304] (got -5)"), std::string::npos) << e.what();
  }
}

TEST(Ptq, WeightQuantizationIsPerChannelRoundHalfEvenSaturating) {
  Tensor w = Tensor::from_vector<float>({2, 3}, {0.5f, 1.5f, -2.5f, 10.f, -300.f, 4.f});
  Tensor q = quant::quantize_weight_s8(w, {1.f, 2.f}, 0);
  auto v = q.to_int64_vector();
  EXPECT_EQ(v, (std::vector<int64_t>{0, 2, -2, 5, -127, 2}));
  // 7 bits saturate at +-63.
  Tensor w7 = Tensor::from_vector<float>({1, 4}, {62.5f, 63.6f, -100.f, -63.4f});
  EXPECT_EQ(quant::quantize_weight_s8(w7, {1.f}, 0, 7).to_int64_vector(), (std::vector<int64_t>{62, 63, -63, -63}));
}

// bias_correction: the rounded channel's mean and spread are matched to the float one, then rounded
// again: [0.45 x6, 2.3, -1.2] rounds to [0 x6, 2, -1] (mean 0.125 against 0.475); matched, 2 moves to
// 2.58 and rounds to 3 (mean 0.25).
TEST(Ptq, BiasCorrectionMatchesChannelMeanAndSpreadBeforeRoundingAgain) {
  const Tensor w = Tensor::from_vector<float>({1, 8}, {0.45f, 0.45f, 0.45f, 0.45f, 0.45f, 0.45f, 2.3f, -1.2f});
  EXPECT_EQ(quant::quantize_weight_s8(w, {1.f}, 0).to_int64_vector(), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 2, -1}));
  EXPECT_EQ(quant::quantize_weight_s8(w, {1.f}, 0, 8, true).to_int64_vector(),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 3, -1}));
  // A channel the grid already represents exactly stays as it is.
  const Tensor exact = Tensor::from_vector<float>({2, 2}, {1.f, -2.f, 4.f, 6.f});
  EXPECT_EQ(quant::quantize_weight_s8(exact, {1.f, 2.f}, 0, 8, true).to_int64_vector(),
            (std::vector<int64_t>{1, -2, 2, 3}));
}

TEST(QuantConfig, YamlBiasCorrectionIsReadAndAdaroundIsRefusedByName) {
  test::TempDir tmp("yaml_rounding");
  std::ofstream(tmp.path("bc.yaml")) << "bias_correction: true\nround_type: round\n";
  EXPECT_TRUE(quant::load_quant_config_yaml(tmp.path("bc.yaml")).bias_correction);
  EXPECT_FALSE(quant::QuantConfig().bias_correction);
  std::ofstream(tmp.path("ada.yaml")) << "round_type: adaround\n";
  try {
    quant::load_quant_config_yaml(tmp.path("ada.yaml"));
    FAIL() << "round_type: adaround was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("round_type: adaround is not implemented"), std::string::npos) << e.what();
  }
}

TEST(Ptq, SevenBitWeightsStayWithinPlusMinus63AndLowerToExactInt8) {
  quant::QuantConfig cfg;
  cfg.weight_bits = 7;
  const ir::Graph qdq = test::calibrated_qdq("resnet_small", 64, cfg);
  int weights = 0, at_63 = 0;
  for (const auto& [name, t] : qdq.initializers) {
    if (t.dtype() != DType::kInt8 || t.rank() < 2) continue;
    ++weights;
    for (int64_t v : t.to_int64_vector()) {
      ASSERT_LE(std::abs(v), 63) << name;
      at_63 += std::abs(v) == 63;
    }
  }
  EXPECT_EQ(weights, 17);  // 16 Conv + Gemm
  EXPECT_GT(at_63, 0);     // each channel's max |w| maps to 63
  quant::QuantConfig bad;
  bad.weight_bits = 9;
  EXPECT_THROW(quant::PTQ(bad).quantize(ir::load_onnx(test::fixture_model("resnet_small"))), Error);
}

class PtqOnResnet : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ptq_ = new quant::PTQ(quant::QuantConfig{});
    ptq_->quantize(ir::load_onnx(test::fixture_model("resnet_small")));
    data::DataOptions o;
    o.spec = "fashion-mnist:train";
    o.limit = 128;
    auto ds = data::open_dataset(o);
    for (const auto& b : data::BatchLoader(*ds, 32)) ptq_->sample(b.inputs);
  }
  static void TearDownTestSuite() { delete ptq_; }
  static quant::PTQ* ptq_;
};
quant::PTQ* PtqOnResnet::ptq_ = nullptr;

TEST_F(PtqOnResnet, EveryConvAndGemmIsALayerWithOneQdqPerTensor) {
  int convs = 0;
  for (const auto& n : ptq_->float_graph().nodes) convs += n.op_type == "Conv" || n.op_type == "Gemm";
  EXPECT_EQ(static_cast<int>(ptq_->layers().size()), convs);
  ir::Graph qdq = ptq_->convert();
  int q = 0, dq = 0;
  for (const auto& n : qdq.nodes) {
    q += n.op_type == "QuantizeLinear";
    dq += n.op_type == "DequantizeLinear";
  }
  // One Q/DQ pair per distinct activation tensor, one DQ per weight.
  EXPECT_EQ(q, static_cast<int>(ptq_->observed_tensors().size()));
  EXPECT_EQ(dq, q + convs);
  EXPECT_NO_THROW(ir::check_onnx(qdq));
  // Weights are int8 initializers; no float copy of a quantized weight remains.
  for (const auto& l : ptq_->layers()) EXPECT_FALSE(qdq.is_initializer(l.weight)) << l.weight;
}

TEST_F(PtqOnResnet, ReluOutputsUseUnsignedZeroPointZero) {
  int unsigned_tensors = 0;
  for (const auto& t : ptq_->observed_tensors()) {
    auto p = ptq_->activation_params(t);
    ASSERT_EQ(p.scale.size(), 1u);
    EXPECT_GT(p.scale[0], 0.f);
    if (p.dtype == DType::kUInt8) {
      ++unsigned_tensors;
      EXPECT_EQ(p.zero_point[0], 0);
      EXPECT_GE(ptq_->activation_observer(t).observed_min(), 0.f);
    }
  }
  EXPECT_GT(unsigned_tensors, 10);  // post-ReLU activations
}

TEST_F(PtqOnResnet, ConvertSubsetQuantizesOnlyThoseLayers) {
  const auto& first = ptq_->layers().front();
  ir::Graph one = ptq_->convert(std::set<std::string>{first.name});
  int weight_dq = 0;
  for (const auto& n : one.nodes)
    if (n.op_type == "DequantizeLinear" && n.has_attr("axis")) ++weight_dq;
  EXPECT_EQ(weight_dq, 1);
}

// The QDQ graph with every zero point the export leaves out (ONNX's defaults) written out: uint8 0
// for activations, int8 zeros for weights, in the shape of the scale.
ir::Graph with_explicit_zero_points(const ir::Graph& qdq) {
  ir::Graph g = qdq;
  for (auto& n : g.nodes) {
    if (n.op_type != "QuantizeLinear" && n.op_type != "DequantizeLinear") continue;
    if (n.inputs.size() == 3) continue;
    const Tensor* x = g.initializer(n.inputs[0]);
    const DType type = n.op_type == "DequantizeLinear" && x ? x->dtype() : DType::kUInt8;
    const std::string zp = g.unique_value_name(n.outputs[0] + "_zp0");
    g.initializers[zp] = Tensor(type, g.initializer(n.inputs[1])->shape());
    n.inputs.push_back(zp);
  }
  return g;
}

bool is_qdq(const ir::Node& n) { return n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear"; }

// The exported file stays small: no value_info, no weight zero points, unnamed Q/DQ nodes;
// activation zero points are always stated (ONNX Runtime 1.30 needs them). It loads back and computes exactly what the in-memory graph and the
// graph with every zero point spelled out compute, simulated and in integer execution.
TEST_F(PtqOnResnet, ExportStatesActivationZeroPointsOmitsValueInfoAndRoundTrips) {
  const ir::Graph qdq = ptq_->convert();
  EXPECT_TRUE(qdq.value_info.empty());
  int weight_dq = 0, u8_pairs = 0;
  for (const auto& n : qdq.nodes) {
    if (!is_qdq(n)) continue;
    EXPECT_TRUE(n.name.empty()) << n.describe();
    EXPECT_EQ(n.describe(), n.op_type + " '" + n.outputs[0] + "'");
    if (const Tensor* w = qdq.initializer(n.inputs[0])) {  // int8 per-channel weight
      ++weight_dq;
      EXPECT_EQ(w->dtype(), DType::kInt8) << n.describe();
      EXPECT_EQ(n.inputs.size(), 2u) << n.describe();
      EXPECT_TRUE(n.has_attr("axis")) << n.describe();
      continue;
    }
    if (n.op_type != "QuantizeLinear") continue;
    const QuantParam p = ptq_->activation_params(n.inputs[0]);
    const bool u8_zero = p.dtype == DType::kUInt8 && p.zero_point.at(0) == 0;
    ASSERT_EQ(n.inputs.size(), 3u) << n.describe();
    const Tensor& zp = *qdq.initializer(n.inputs[2]);
    EXPECT_EQ(zp.dtype(), p.dtype == DType::kUInt8 ? DType::kUInt8 : DType::kInt8) << n.describe();
    for (int c : qdq.consumers(n.outputs[0])) {
      EXPECT_EQ(qdq.nodes[c].op_type, "DequantizeLinear");
      EXPECT_EQ(qdq.nodes[c].inputs.size(), n.inputs.size()) << qdq.nodes[c].describe();
    }
    u8_pairs += u8_zero;
  }
  EXPECT_EQ(weight_dq, static_cast<int>(ptq_->layers().size()));
  EXPECT_GT(u8_pairs, 10);  // the input and the post-ReLU activations

  test::TempDir tmp("qdq_export");
  ir::save_onnx(qdq, tmp.path("q.onnx"));  // runs the ONNX checker
  const ir::Graph back = ir::load_onnx(tmp.path("q.onnx"));
  EXPECT_TRUE(back.value_info.empty());
  const ir::Graph spelled = with_explicit_zero_points(qdq);
  EXPECT_NO_THROW(ir::check_onnx(spelled));

  data::DataOptions o;
  o.spec = "fashion-mnist:test";
  o.limit = 64;
  auto ds = data::open_dataset(o);
  const Tensor x = data::BatchLoader(*ds, 64).batch(0).inputs;
  auto expect_same = [](const Tensor& a, const Tensor& b, const char* what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << what << " at " << i;
  };
  const Tensor sim = runtime::Session(qdq).run_single(x);
  expect_same(sim, runtime::Session(back).run_single(x), "simulated, loaded back");
  expect_same(sim, runtime::Session(spelled).run_single(x), "simulated, zero points spelled out");
  quant::LoweringReport report;
  const ir::Graph lowered = quant::lower_to_int8(back, {}, &report);
  EXPECT_EQ(report.lowered(), static_cast<int>(ptq_->layers().size()));
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.front().reason;
  const Tensor integer = quant::make_int8_session(qdq).run_single(x);
  expect_same(integer, runtime::Session(lowered).run_single(x), "integer, loaded back");
  expect_same(integer, quant::make_int8_session(spelled).run_single(x), "integer, zero points spelled out");
}

TEST(Ptq, EmptyCalibrationIsAClearError) {
  quant::PTQ ptq(quant::QuantConfig{});
  ptq.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
  try {
    ptq.convert();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  }
}

}  // namespace

namespace {
ir::Node op_node(const std::string& op, std::vector<std::string> in, std::string out,
                 std::map<std::string, ir::AttributeValue> attrs = {}) {
  ir::Node n;
  n.op_type = op;
  n.name = out + "_node";
  n.inputs = std::move(in);
  n.outputs = {std::move(out)};
  n.attrs = std::move(attrs);
  return n;
}
}  // namespace

// With is_full_quantize, Concat also matches the int64 shape arithmetic exporters emit for a
// Resize's `sizes` (Shape -> Slice -> Concat): only float values may get observers and Q/DQ.
TEST(Ptq, FullQuantizeLeavesShapeArithmeticAlone) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {2, ""}, {4, ""}, {4, ""}}});
  g.outputs.push_back({"out", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {8, ""}, {8, ""}, {8, ""}}});
  std::vector<float> w(4 * 2 * 9);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(static_cast<int>(i % 11) - 5);
  g.initializers["w"] = Tensor::from_vector<float>({4, 2, 3, 3}, w);
  g.initializers["starts"] = Tensor::from_vector<int64_t>({1}, {0});
  g.initializers["ends"] = Tensor::from_vector<int64_t>({1}, {2});
  g.initializers["hw"] = Tensor::from_vector<int64_t>({2}, {8, 8});
  g.nodes.push_back(op_node("Conv", {"x", "w"}, "y", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
  g.nodes.push_back(op_node("Shape", {"y"}, "shape"));
  g.nodes.push_back(op_node("Slice", {"shape", "starts", "ends"}, "nc"));
  g.nodes.push_back(op_node("Concat", {"nc", "hw"}, "sizes", {{"axis", int64_t{0}}}));
  g.nodes.push_back(op_node("Resize", {"y", "", "", "sizes"}, "up", {{"mode", std::string("nearest")}}));
  g.nodes.push_back(op_node("Concat", {"up", "up"}, "out", {{"axis", int64_t{1}}}));
  g.validate();

  quant::QuantConfig cfg;
  cfg.is_full_quantize = true;
  quant::PTQ ptq(cfg);
  ptq.quantize(g);
  for (const auto& t : ptq.observed_tensors()) EXPECT_NE(t, "nc") << "an int64 shape got an observer";
  Tensor x(DType::kFloat32, {3, 2, 4, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.01f * static_cast<float>(i % 37);
  ptq.sample({{"x", x}});
  const ir::Graph qdq = ptq.convert();
  EXPECT_NO_THROW(ir::check_onnx(qdq));
  const Tensor y = runtime::Session(qdq).run_single(x);
  EXPECT_EQ(y.shape(), (Shape{3, 8, 8, 8}));
}

// Squeeze-excitation block: c = Conv(x); gate = HardSigmoid(Conv(Relu(Conv(GlobalAveragePool(c)))));
// y = Mul(c, gate), upsampled by a ConvTranspose. For our runtime PTQ quantizes c for its pool and
// gating (the squeeze-excitation rule), but only where Conv is a quantized type.
namespace {
ir::Graph squeeze_excitation_graph() {
  std::mt19937 rng(32);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {4, ""}, {8, ""}, {8, ""}}});
  const std::string c = b.node("Conv", {"x", b.constant(test::random_tensor({8, 4, 3, 3}, rng, -0.3f, 0.3f))},
                               {{"pads", std::vector<int64_t>(4, 1)}});
  const std::string pooled = b.node("GlobalAveragePool", {c});
  const std::string squeezed =
      b.node("Relu", {b.node("Conv", {pooled, b.constant(test::random_tensor({4, 8, 1, 1}, rng))})});
  const std::string gate =
      b.node("HardSigmoid", {b.node("Conv", {squeezed, b.constant(test::random_tensor({8, 4, 1, 1}, rng))})});
  const std::string gated = b.node("Mul", {c, gate});
  b.g.outputs.push_back({b.node("ConvTranspose", {gated, b.constant(test::random_tensor({8, 2, 2, 2}, rng))},
                                {{"strides", std::vector<int64_t>{2, 2}}}),
                         DType::kFloat32, std::nullopt});
  return b.g;
}

// The op types of the PTQ's layers, and of the nodes reading a DequantizeLinear in its export.
std::pair<std::multiset<std::string>, std::multiset<std::string>> quantized_op_types(quant::QuantConfig cfg) {
  quant::PTQ ptq(std::move(cfg));
  ptq.quantize(squeeze_excitation_graph());
  std::mt19937 rng(33);
  ptq.sample({{"x", test::random_tensor({1, 4, 8, 8}, rng)}});
  std::multiset<std::string> layers, reading_dq;
  for (const auto& l : ptq.layers()) layers.insert(l.op_type);
  const ir::Graph q = ptq.convert();
  for (const ir::Node& n : q.nodes) {
    if (n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear") continue;
    for (const auto& in : n.inputs) {
      const int p = q.producer(in);
      if (p >= 0 && q.nodes[static_cast<size_t>(p)].op_type == "DequantizeLinear") {
        reading_dq.insert(n.op_type);
        break;
      }
    }
  }
  return {layers, reading_dq};
}
}  // namespace

TEST(Ptq, QuantizableOpTypeBoundsTheSqueezeExcitationRule) {
  // The default list: the rule applies (the pool and the gating Mul read c's codes; the squeeze
  // convolution reading the pooled vector stays float).
  const auto [default_layers, default_readers] = quantized_op_types(quant::QuantConfig());
  EXPECT_EQ(default_layers.count("GlobalAveragePool"), 1u);
  EXPECT_EQ(default_layers.count("Mul"), 1u);
  EXPECT_EQ(default_readers.count("GlobalAveragePool"), 1u);
  EXPECT_EQ(default_readers.count("Mul"), 1u);

  // Only ConvTranspose (Paddle's name or ONNX's): nothing else is quantized, pattern rules included.
  for (const std::string name : {"conv2d_transpose", "ConvTranspose"}) {
    quant::QuantConfig cfg;
    cfg.quantizable_op_type = {name};
    const auto [layers, readers] = quantized_op_types(cfg);
    EXPECT_EQ(layers, (std::multiset<std::string>{"ConvTranspose"})) << name;
    EXPECT_EQ(readers, (std::multiset<std::string>{"ConvTranspose"})) << name;
  }

  // QuantConfig(None, None) + a type rule (seed 003): the pool and Mul have no rule quantizing them.
  quant::QuantConfig none(quant::QuantRule{"abs_max", "channel_wise_abs_max", false});
  none.add_type_config({"Conv"}, quant::QuantRule{"abs_max", "channel_wise_abs_max", true});
  const auto [conv_layers, conv_readers] = quantized_op_types(none);
  EXPECT_EQ(conv_layers.count("GlobalAveragePool") + conv_layers.count("Mul") + conv_layers.count("ConvTranspose"), 0u);
  EXPECT_GE(conv_layers.count("Conv"), 1u);
}

// The rule is generic (code_readable_inputs): a Conv output that two or more readers all read as
// codes (their kernels declare Fold::kDequantizedInput there) is quantized for all of them; one
// reader that does not, or a single reader (left to the execution fusions), keeps it float.
TEST(Ptq, AConvOutputThatEveryReaderReadsAsCodesIsQuantizedForAllOfThem) {
  auto layer_types = [](const std::vector<std::string>& readers) {
    std::mt19937 rng(34);
    test::GraphBuilder b;
    b.g.opset = 13;
    b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {4, ""}, {6, ""}, {6, ""}}});
    const std::string c = b.node("Conv", {"x", b.constant(test::random_tensor({4, 4, 3, 3}, rng, -0.3f, 0.3f))},
                                 {{"pads", std::vector<int64_t>(4, 1)}});
    for (const std::string& op : readers)
      b.g.outputs.push_back({op == "Relu" ? b.node(op, {c}) : b.node(op, {c, "x"}), DType::kFloat32, std::nullopt});
    quant::PTQ ptq{quant::QuantConfig()};
    ptq.quantize(b.g);
    std::multiset<std::string> types;
    for (const auto& l : ptq.layers()) types.insert(l.op_type);
    return types;
  };
  EXPECT_EQ(layer_types({"Add", "Sub"}), (std::multiset<std::string>{"Conv", "Add", "Sub"}));
  EXPECT_EQ(layer_types({"Add", "Mul", "Div"}), (std::multiset<std::string>{"Conv", "Add", "Mul", "Div"}));
  EXPECT_EQ(layer_types({"Add", "Relu"}), (std::multiset<std::string>{"Conv"}));
  EXPECT_EQ(layer_types({"Add"}), (std::multiset<std::string>{"Conv"}));
}

// Which zero points the export writes: every activation's, of its type, even u8 with zero point 0
// (QuantizeLinear's default: ONNX Runtime 1.30 fails to optimize Conv -> Relu -> Q without it);
// symmetric int8 weights none.
TEST(QdqExport, StatesEveryActivationZeroPointAndNoWeightZeroPoint) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {2, ""}, {4, ""}, {4, ""}}});
  g.outputs.push_back({"y", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {2, ""}, {4, ""}, {4, ""}}});
  std::vector<float> w(2 * 2);
  for (const char* name : {"w1", "w2", "w3"}) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i + 1) * (name[1] == '2' ? -1.f : 1.f);
    g.initializers[name] = Tensor::from_vector<float>({2, 2, 1, 1}, w);
  }
  g.nodes.push_back(op_node("Conv", {"x", "w1"}, "a"));
  g.nodes.push_back(op_node("Conv", {"a", "w2"}, "b"));
  g.nodes.push_back(op_node("Conv", {"b", "w3"}, "y"));
  const std::vector<quant::Layer> layers = {{"a_node", "Conv", {"x"}, "w1", 0, ""},
                                            {"b_node", "Conv", {"a"}, "w2", 0, ""},
                                            {"y_node", "Conv", {"b"}, "w3", 0, ""}};
  std::vector<const quant::Layer*> chosen;
  for (const auto& l : layers) chosen.push_back(&l);
  auto per_tensor = [](DType t, float scale, int32_t zp) {
    QuantParam p;
    p.dtype = t;
    p.scale = {scale};
    p.zero_point = {zp};
    return p;
  };
  const std::map<std::string, QuantParam> act = {{"x", per_tensor(DType::kUInt8, 1.f / 255, 0)},
                                                          {"a", per_tensor(DType::kUInt8, 0.01f, 128)},
                                                          {"b", per_tensor(DType::kInt8, 0.01f, 0)}};
  auto weight_params = [](const quant::Layer&) {
    QuantParam p;
    p.scale = {0.2f / 127, 0.4f / 127};
    p.zero_point = {0, 0};
    p.axis = 0;
    return p;
  };
  const ir::Graph qdq = quant::write_qdq_graph(g, chosen, act, weight_params);
  EXPECT_TRUE(qdq.value_info.empty());
  std::map<std::string, const ir::Node*> quantize_of;
  int weight_dq = 0;
  for (const auto& n : qdq.nodes) {
    if (n.op_type == "QuantizeLinear") quantize_of[n.inputs[0]] = &n;
    if (n.op_type == "DequantizeLinear" && qdq.is_initializer(n.inputs[0])) {
      ++weight_dq;
      EXPECT_EQ(n.inputs.size(), 2u) << n.describe();
    }
  }
  EXPECT_EQ(weight_dq, 3);
  ASSERT_EQ(quantize_of.size(), 3u);
  ASSERT_EQ(quantize_of.at("x")->inputs.size(), 3u);
  const Tensor& zp_x = *qdq.initializer(quantize_of.at("x")->inputs[2]);
  EXPECT_EQ(zp_x.dtype(), DType::kUInt8);
  EXPECT_EQ(zp_x.data<uint8_t>()[0], 0);
  EXPECT_EQ(quantize_of.at("x")->outputs[0], "x_q");
  ASSERT_EQ(quantize_of.at("a")->inputs.size(), 3u);
  const Tensor& zp_a = *qdq.initializer(quantize_of.at("a")->inputs[2]);
  EXPECT_EQ(zp_a.dtype(), DType::kUInt8);
  EXPECT_EQ(zp_a.data<uint8_t>()[0], 128);
  ASSERT_EQ(quantize_of.at("b")->inputs.size(), 3u);
  EXPECT_EQ(qdq.initializer(quantize_of.at("b")->inputs[2])->dtype(), DType::kInt8);
  for (const auto& [t, q] : quantize_of) {
    const std::vector<int> readers = qdq.consumers(q->outputs[0]);
    ASSERT_EQ(readers.size(), 1u);
    EXPECT_EQ(qdq.nodes[readers[0]].inputs.size(), q->inputs.size()) << t;
    EXPECT_EQ(qdq.nodes[readers[0]].outputs[0], t + "_dq");
  }
  EXPECT_NO_THROW(ir::check_onnx(qdq));
  quant::LoweringReport report;
  quant::lower_to_int8(qdq, {}, &report);
  EXPECT_EQ(report.lowered(), 3);  // the integer run below runs fused kernels on all three
  Tensor x(DType::kFloat32, {1, 2, 4, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.03f * static_cast<float>(i % 29);
  const ir::Graph spelled = with_explicit_zero_points(qdq);
  for (bool integer : {false, true}) {
    const Tensor y = integer ? quant::make_int8_session(qdq).run_single(x) : runtime::Session(qdq).run_single(x);
    const Tensor want = integer ? quant::make_int8_session(spelled).run_single(x) : runtime::Session(spelled).run_single(x);
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], want.data<float>()[i]) << integer << " " << i;
  }
}
