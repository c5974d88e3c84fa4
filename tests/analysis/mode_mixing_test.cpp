// Analysis on every mode (issue 33): the PTQ analysis ranks layers under weight-only and dynamic
// mode, and the target search mixes static, weight-only and dynamic layers in one model
// (TargetSearchOptions::fallback, PTQ::convert_layers, QuantConfig::node_modes).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/analysis_test_util.h"
#include "e2e/onnx_runtime_peer.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/target_search.h"
#include "slimquant/core/npy.h"
#include "slimquant/quant/lowering.h"

using namespace slimquant;

namespace {

// The fixture model calibrated with abs_max (4 batches of 32 training images) under `mode`.
std::unique_ptr<quant::PTQ> mode_ptq(const std::string& model, quant::QuantMode mode,
                                     std::vector<std::pair<std::string, quant::QuantMode>> node_modes = {}) {
  quant::QuantConfig cfg;
  cfg.global().activation = "abs_max";
  cfg.weight_bits = 8;
  cfg.mode = mode;
  cfg.node_modes = std::move(node_modes);
  auto ptq = std::make_unique<quant::PTQ>(cfg);
  ptq->quantize(ir::load_onnx(test::fixture_model(model)));
  auto calib = data::open_dataset(test::fmnist("train", 128));
  data::BatchLoader loader(*calib, 32);
  for (size_t i = 0; i < loader.num_batches(); ++i) ptq->sample(loader.batch(i).inputs);
  return ptq;
}

// SQNR (dB) against FP32 of `model` run as the analysis runs its variants (float session).
double mode_sqnr(const ir::Graph& model, const ir::Graph& fp32_graph, const data::Dataset& data, bool int8) {
  runtime::Session fp32(fp32_graph);
  runtime::Session s = int8 ? quant::make_int8_session(model) : runtime::Session(model);
  auto m = analysis::make_metric("sqnr");
  analysis::EvalOptions eo;
  eo.reference = &fp32;
  return analysis::evaluate(s, data, *m, eo).value;
}

const analysis::LayerSensitivity& ranked_layer(const analysis::SensitivityReport& r, const std::string& name) {
  for (const auto& l : r.ranked)
    if (l.name == name) return l;
  throw std::runtime_error("no layer " + name);
}

// What a node reads, input by input: a DequantizeLinear's initializers (codes, scales, zero points)
// and, for an activation, its QuantizeLinear's scale and zero point; an initializer's bytes; or
// "value" (a float activation).
std::string tensor_bytes(const Tensor& t) {
  std::ostringstream os;
  os << static_cast<int>(t.dtype()) << ':';
  for (auto d : t.shape()) os << d << 'x';
  os << ':' << std::string(static_cast<const char*>(t.raw()), t.nbytes());
  return os.str();
}

std::string layer_form(const ir::Graph& g, const std::string& layer) {
  const auto node = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.name == layer; });
  if (node == g.nodes.end()) return "missing";
  std::string form = node->op_type;
  for (const auto& in : node->inputs) {
    form += '|';
    if (in.empty()) continue;
    if (const Tensor* t = g.initializer(in)) {
      form += "init " + tensor_bytes(*t);
      continue;
    }
    const int p = g.producer(in);
    if (p < 0 || g.nodes[static_cast<size_t>(p)].op_type != "DequantizeLinear") {
      form += "value";
      continue;
    }
    const ir::Node& dq = g.nodes[static_cast<size_t>(p)];
    form += "DQ";
    for (const auto& a : dq.attrs)
      if (std::holds_alternative<int64_t>(a.second)) form += " " + a.first + "=" + std::to_string(std::get<int64_t>(a.second));
    for (const auto& v : dq.inputs) {
      if (const Tensor* t = g.initializer(v)) form += " " + tensor_bytes(*t);
      else if (const int q = g.producer(v); q >= 0 && g.nodes[static_cast<size_t>(q)].op_type == "QuantizeLinear")
        for (size_t i = 1; i < g.nodes[static_cast<size_t>(q)].inputs.size(); ++i)
          form += " Q " + tensor_bytes(*g.initializer(g.nodes[static_cast<size_t>(q)].inputs[i]));
      else form += " ?";
    }
  }
  return form;
}

// The first output of `model` on the fixture's input, in our integer execution.
Tensor mode_logits(const std::string& model, const std::string& input_npy) {
  runtime::Session s = quant::make_int8_session(ir::load_onnx(model));
  return s.run({{s.input_names().at(0), read_npy(input_npy)}}).begin()->second;
}

float worst_difference(const Tensor& a, const Tensor& b, float* range) {
  float worst = 0;
  *range = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(a.data<float>()[i] - b.data<float>()[i]));
    *range = std::max(*range, std::abs(a.data<float>()[i]));
  }
  return worst;
}

// Under weight-only mode each layer is ranked with only its weight rounded: every layer loses
// less than with static INT8 (weights and activations), and the order changes. Under dynamic mode
// the ranking has every layer with a finite SQNR. A layer's number is that of its own mode's model.
TEST(PtqAnalysis, RanksLayersUnderWeightOnlyAndDynamicMode) {
  test::SingleThread single_thread;
  auto data = data::open_dataset(test::fmnist("test", 128));
  auto metric = analysis::make_metric("sqnr");
  test::TempDir tmp("analysis_modes");
  std::map<quant::QuantMode, analysis::SensitivityReport> reports;
  std::map<quant::QuantMode, std::unique_ptr<quant::PTQ>> ptqs;
  for (auto mode : {quant::QuantMode::kStatic, quant::QuantMode::kWeightOnly, quant::QuantMode::kDynamic}) {
    ptqs[mode] = mode_ptq("vit_small", mode);
    analysis::PtqAnalysisOptions po;
    po.save_dir = tmp.path(quant::quant_mode_name(mode));
    reports[mode] = analysis::analyze_ptq(*ptqs[mode], *data, *metric, po);
  }
  const auto& st = reports[quant::QuantMode::kStatic];
  const auto& wo = reports[quant::QuantMode::kWeightOnly];
  const auto& dy = reports[quant::QuantMode::kDynamic];
  ASSERT_EQ(wo.ranked.size(), st.ranked.size());
  std::vector<std::string> st_order, wo_order;
  size_t weighted = 0, strictly_better = 0;
  for (size_t i = 0; i < st.ranked.size(); ++i) st_order.push_back(st.ranked[i].name), wo_order.push_back(wo.ranked[i].name);
  EXPECT_NE(st_order, wo_order) << "weight-only ranks the layers by their weights' rounding alone";
  double st_loss = 0, wo_loss = 0;
  for (const auto& l : ptqs[quant::QuantMode::kStatic]->layers()) {
    const auto& s = ranked_layer(st, l.name);
    const auto& w = ranked_layer(wo, l.name);
    if (l.weight.empty()) {
      EXPECT_GE(w.metric, 100.0) << l.name << ": no weight, weight-only leaves it float";
      continue;
    }
    ++weighted;
    // Equal where static adds no activation error (patch_embed reads the image, k/255 pixels exactly on its grid).
    EXPECT_GE(w.metric, s.metric) << l.name << ": weight-only " << w.metric << " dB vs static " << s.metric << " dB";
    strictly_better += w.metric > s.metric;
    st_loss += s.delta, wo_loss += w.delta;
  }
  EXPECT_GT(weighted, 0u);
  EXPECT_GE(strictly_better + 1, weighted);
  EXPECT_LT(wo_loss, st_loss);
  std::cout << "vit_small per-layer SQNR loss, summed over " << weighted << " weighted layers (" << strictly_better << " strictly smaller weight-only): static " << st_loss
            << " dB, weight-only " << wo_loss << " dB; most damaging: static " << st_order[0] << " ("
            << st.ranked[0].metric << " dB), weight-only " << wo_order[0] << " (" << wo.ranked[0].metric << " dB), dynamic "
            << dy.ranked[0].name << " (" << dy.ranked[0].metric << " dB)" << std::endl;

  ASSERT_EQ(dy.ranked.size(), ptqs[quant::QuantMode::kDynamic]->layers().size());
  ASSERT_FALSE(dy.ranked.empty());
  for (const auto& l : dy.ranked) EXPECT_TRUE(std::isfinite(l.metric) && std::isfinite(l.delta)) << l.name;
  EXPECT_NE(dy.ranked.front().metric, dy.ranked.back().metric);
  // Each number is that of the layer quantized alone in its mode's form.
  for (auto mode : {quant::QuantMode::kWeightOnly, quant::QuantMode::kDynamic}) {
    const auto& top = reports[mode].ranked.front();
    const quant::PTQ& p = *ptqs[mode];
    const ir::Graph alone = mode == quant::QuantMode::kWeightOnly ? p.convert_weights_only(std::set<std::string>{top.name})
                                                                  : p.convert_dynamic(std::set<std::string>{top.name});
    EXPECT_NEAR(mode_sqnr(alone, p.float_graph(), *data, false), top.metric, 0.05) << quant::quant_mode_name(mode);
  }
}

// QuantConfig::node_modes: the layers they name take that mode; convert() then writes static and
// weight-only layers in one model, each exactly as its own mode's convert writes it.
TEST(TargetSearch, NodeModesMixStaticAndWeightOnlyLayers) {
  test::SingleThread single_thread;
  auto all_static = mode_ptq("vit_small", quant::QuantMode::kStatic);
  auto mixed = mode_ptq("vit_small", quant::QuantMode::kStatic, {{"MatMul", quant::QuantMode::kWeightOnly}});
  size_t weight_only = 0;
  for (const auto& l : mixed->layers()) weight_only += l.mode == quant::QuantMode::kWeightOnly;
  ASSERT_GT(weight_only, 0u);
  ASSERT_LT(weight_only, mixed->layers().size());
  const ir::Graph g = mixed->convert();
  EXPECT_EQ(g.metadata.at("slimquant.mode"), "mixed");
  EXPECT_EQ(g.metadata.at("slimquant.weight_only_layers"), std::to_string(weight_only));
  EXPECT_EQ(ir::serialize_onnx(g), ir::serialize_onnx(all_static->convert_layers(mixed->layer_modes())));
  const ir::Graph st = all_static->convert();
  const ir::Graph wo = all_static->convert_weights_only();
  for (const auto& l : mixed->layers()) {
    const bool is_wo = l.mode == quant::QuantMode::kWeightOnly;
    EXPECT_EQ(layer_form(g, l.name), layer_form(is_wo ? wo : st, l.name)) << l.name;
    if (!l.weight.empty()) {
      EXPECT_NE(layer_form(st, l.name), layer_form(wo, l.name)) << l.name;
    }
  }
  // One mode alone: that mode's convert, byte for byte.
  EXPECT_EQ(ir::serialize_onnx(all_static->convert_layers(all_static->layer_modes())), ir::serialize_onnx(st));
  quant::LayerModes every_wo = all_static->layer_modes();
  for (auto& [name, mode] : every_wo) mode = quant::QuantMode::kWeightOnly;
  EXPECT_EQ(ir::serialize_onnx(all_static->convert_layers(every_wo)), ir::serialize_onnx(wo));
  EXPECT_THROW(mixed->convert_layers({{"no such layer", quant::QuantMode::kStatic}}), Error);
}

// A dynamic layer's integer node as convert_dynamic writes it: op type and the bytes of every
// initializer it and its scale Mul read.
std::string dynamic_form(const ir::Graph& g, const std::string& layer) {
  const auto node = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.name == layer + "_quant"; });
  if (node == g.nodes.end()) return "missing";
  std::string form = node->op_type;
  for (const auto& in : node->inputs)
    if (const Tensor* t = g.initializer(in)) form += "|" + tensor_bytes(*t);
  for (const auto& n : g.nodes)
    if (n.name == layer + "_scales_mul")
      for (const auto& in : n.inputs)
        if (const Tensor* t = g.initializer(in)) form += "|scale " + tensor_bytes(*t);
  return form;
}

// Static, weight-only and dynamic layers in one model (--node-mode MatMul=dynamic, the first Conv
// weight-only): each layer exactly as its own mode's convert writes it (the attention MatMuls,
// with no constant weight, have no dynamic form: float, said in one warning); the model runs in
// our integer execution and in ONNX Runtime (pinned and latest) with the same outputs.
TEST(TargetSearch, NodeModesMixDynamicWithStaticAndWeightOnlyLayers) {
  test::SingleThread single_thread;
  auto all_static = mode_ptq("vit_small", quant::QuantMode::kStatic);
  quant::LayerModes modes = all_static->layer_modes();
  size_t dynamic = 0, weight_only = 0, no_dynamic_form = 0;
  for (const auto& l : all_static->layers()) {
    if (l.op_type == "MatMul") {
      modes[l.name] = quant::QuantMode::kDynamic, ++dynamic;
      no_dynamic_form += !all_static->dynamic_applies(l);
    } else if (l.op_type == "Conv" && weight_only == 0) {
      modes[l.name] = quant::QuantMode::kWeightOnly, ++weight_only;
    }
  }
  ASSERT_GT(dynamic, no_dynamic_form);
  ASSERT_GT(no_dynamic_form, 0u) << "the attention MatMuls read two activations";
  ASSERT_EQ(weight_only, 1u);
  const ir::Graph g = all_static->convert_layers(modes);
  EXPECT_EQ(g.metadata.at("slimquant.mode"), "mixed");
  EXPECT_EQ(g.metadata.at("slimquant.dynamic_layers"), std::to_string(dynamic - no_dynamic_form));
  EXPECT_EQ(g.metadata.at("slimquant.weight_only_layers"), "1");
  // The same model from the config's node_modes.
  auto by_config = mode_ptq("vit_small", quant::QuantMode::kStatic,
                            {{"MatMul", quant::QuantMode::kDynamic},
                             {std::find_if(modes.begin(), modes.end(), [](const auto& m) {
                                return m.second == quant::QuantMode::kWeightOnly;
                              })->first,
                              quant::QuantMode::kWeightOnly}});
  const ir::Graph from_config = by_config->convert();
  const ir::Graph st = all_static->convert();
  const ir::Graph wo = all_static->convert_weights_only();
  const ir::Graph dy = all_static->convert_dynamic();
  for (const auto& l : all_static->layers()) {
    const quant::QuantMode mode = modes.at(l.name);
    if (mode == quant::QuantMode::kDynamic && !all_static->dynamic_applies(l)) {
      EXPECT_EQ(layer_form(g, l.name), "MatMul|value|value") << l.name << ": no dynamic form, float";
    } else if (mode == quant::QuantMode::kDynamic) {
      EXPECT_EQ(dynamic_form(g, l.name), dynamic_form(dy, l.name)) << l.name;
      EXPECT_EQ(dynamic_form(g, l.name).rfind("MatMulInteger", 0), 0u) << l.name;
    } else {
      EXPECT_EQ(layer_form(g, l.name), layer_form(mode == quant::QuantMode::kWeightOnly ? wo : st, l.name)) << l.name;
    }
    EXPECT_EQ(layer_form(from_config, l.name), layer_form(g, l.name)) << l.name;
  }

  auto data = data::open_dataset(test::fmnist("test", 256));
  const double mixed_sqnr = mode_sqnr(g, all_static->float_graph(), *data, true);
  const double static_sqnr = mode_sqnr(st, all_static->float_graph(), *data, true);
  std::cout << "vit_small sqnr: all static " << static_sqnr << " dB, MatMuls dynamic + one Conv weight-only " << mixed_sqnr
            << " dB" << std::endl;
  EXPECT_GT(mixed_sqnr, 30.0);
  EXPECT_LT(mixed_sqnr, 60.0) << "the MatMuls' codes are 8-bit";
  const std::vector<std::string>& warnings = by_config->warnings();
  const std::string said = std::to_string(no_dynamic_form) + " dynamic layers have no dynamic form";
  EXPECT_EQ(std::count_if(warnings.begin(), warnings.end(), [&](const std::string& w) { return w.find(said) == 0; }), 1)
      << testing::PrintToString(warnings);

  test::TempDir tmp("mixed_dynamic");
  const std::string path = tmp.path("mixed.onnx");
  ir::save_onnx(g, path);
  const std::string input = test::source_path("tests/fixtures/models/vit_small.input.npy");
  const Tensor ours = mode_logits(path, input);
  const Tensor simulated = runtime::Session(ir::load_onnx(path)).run({{"input", read_npy(input)}}).begin()->second;
  float range = 0;
  const float simulation_gap = worst_difference(ours, simulated, &range);
  EXPECT_LT(simulation_gap, 0.02f * range) << "integer execution vs simulation";
  if (!test::have_onnx_runtime()) GTEST_SKIP() << "Node.js / onnxruntime-node not installed";
  for (const char* package : {"onnxruntime-node", "onnxruntime-node-latest"}) {
    const Tensor ort = test::onnx_runtime_logits(package, path, input, tmp.path(std::string("ort_") + package));
    ASSERT_EQ(ort.numel(), ours.numel()) << package;
    const float worst = worst_difference(ours, ort, &range);
    std::cout << package << ": worst |ours - ORT| " << worst << " of range " << range << std::endl;
    EXPECT_LT(worst, (test::onnx_runtime_integer_sums_exact() ? 0.02f : 0.15f) * range) << package;
  }
}

// --fallback-mode weight-only: a target halfway between the all-static and the all-weight-only
// model is met with some layers weight-only and none float (--fallback-mode dynamic: its own target); the saved model
// mixes both forms, layer by layer as static and weight-only convert write them, and runs in our
// runtime and in ONNX Runtime with the same outputs.
TEST(TargetSearch, WeightOnlyFallbackMeetsATargetAllStaticMisses) {
  test::SingleThread single_thread;
  auto ptq = mode_ptq("resnet_small", quant::QuantMode::kStatic);
  auto data = data::open_dataset(test::fmnist("test", 256));
  test::TempDir tmp("target_modes");
  auto metric = analysis::make_metric("sqnr");
  analysis::PtqAnalysisOptions po;
  po.save_dir = tmp.path();
  auto report = analysis::analyze_ptq(*ptq, *data, *metric, po);
  const double all_static = mode_sqnr(ptq->convert(), ptq->float_graph(), *data, true);
  const double all_weight_only = mode_sqnr(ptq->convert_weights_only(), ptq->float_graph(), *data, true);
  ASSERT_GT(all_weight_only, all_static + 1.0);
  analysis::TargetSearchOptions to;
  to.target = (all_static + all_weight_only) / 2;  // missed by all static, met by all weight-only
  to.latency_runs = 1;
  to.save_dir = tmp.path("float");
  auto by_float = analysis::search_target(*ptq, report, *data, *metric, to);
  to.save_dir = tmp.path("weight_only");
  to.fallback = analysis::FallbackMode::kWeightOnly;
  auto r = analysis::search_target(*ptq, report, *data, *metric, to);

  EXPECT_FALSE(r.candidates.front().meets);
  EXPECT_NEAR(r.candidates.front().metric, all_static, 1e-9);
  ASSERT_TRUE(r.met);
  const auto& best = r.candidates[r.best];
  EXPECT_GE(best.metric, to.target);
  EXPECT_TRUE(best.skipped.empty());
  ASSERT_GE(best.weight_only.size(), 1u);
  EXPECT_EQ(r.layer_modes.at(best.weight_only[0]), "weight-only");
  EXPECT_EQ(r.fallback_mode, "weight-only");
  // Float fallback (the default) meets it with float layers instead, and a bigger file.
  ASSERT_TRUE(by_float.met);
  const auto& fbest = by_float.candidates[by_float.best];
  EXPECT_TRUE(fbest.weight_only.empty());
  EXPECT_GE(fbest.skipped.size(), 1u);
  EXPECT_GT(fbest.model_bytes, best.model_bytes);
  std::cout << "resnet_small sqnr: all static " << all_static << " dB, all weight-only " << all_weight_only << " dB, target "
            << to.target << " dB; weight-only fallback " << best.metric << " dB with " << best.weight_only.size()
            << " weight-only (" << nlohmann::json(best.weight_only).dump() << "), " << r.candidates.size() << " candidates, "
            << best.model_bytes << " bytes; float fallback " << fbest.metric << " dB with " << fbest.skipped.size()
            << " float (" << nlohmann::json(fbest.skipped).dump() << "), " << by_float.candidates.size() << " candidates, "
            << fbest.model_bytes << " bytes" << std::endl;
  // JSON and table name the modes.
  const auto j = r.to_json();
  EXPECT_EQ(j["weight_only"], best.weight_only);
  EXPECT_EQ(j["fallback_mode"], "weight-only");
  EXPECT_EQ(j["candidates"][r.best]["weight_only"], best.weight_only);
  EXPECT_NE(r.table().find("weight_only_layers"), std::string::npos);
  EXPECT_EQ(by_float.table().find("weight_only_layers"), std::string::npos) << "the float search's table as before";

  // --fallback-mode dynamic: the first ranked layer that gains from the dynamic form (the stem,
  // reading the image, gains nothing) moved to the top of the ranking, and the target set to what
  // it reaches dynamic with all else static: the search's first prefix meets it, that layer
  // dynamic, none float.
  std::string top;
  double top_dynamic = 0;
  for (size_t i = 0; i < report.ranked.size() && top.empty(); ++i) {
    const std::string& name = report.ranked[i].name;
    const auto layer = std::find_if(ptq->layers().begin(), ptq->layers().end(), [&](const quant::Layer& x) { return x.name == name; });
    if (!ptq->dynamic_applies(*layer)) continue;
    top_dynamic = mode_sqnr(analysis::candidate_graph(*ptq, {}, {}, {name}), ptq->float_graph(), *data, true);
    if (top_dynamic > all_static + 0.05) top = name;
  }
  ASSERT_FALSE(top.empty()) << "no layer gains from the dynamic form";
  analysis::SensitivityReport reordered = report;
  std::stable_partition(reordered.ranked.begin(), reordered.ranked.end(),
                        [&](const analysis::LayerSensitivity& l) { return l.name == top; });
  to.target = top_dynamic;
  to.fallback = analysis::FallbackMode::kDynamic;
  to.save_dir = tmp.path("dynamic");
  auto rd = analysis::search_target(*ptq, reordered, *data, *metric, to);
  ASSERT_TRUE(rd.met);
  const auto& dbest = rd.candidates[rd.best];
  EXPECT_EQ(dbest.metric, top_dynamic);
  EXPECT_EQ(dbest.dynamic, std::vector<std::string>{top});
  EXPECT_TRUE(dbest.skipped.empty() && dbest.weight_only.empty());
  EXPECT_EQ(rd.layer_modes.at(top), "dynamic");
  EXPECT_EQ(rd.to_json()["dynamic"], dbest.dynamic);
  EXPECT_NE(rd.table().find("dynamic_layers"), std::string::npos);
  const ir::Graph dsaved = ir::load_onnx(rd.model_path);
  EXPECT_EQ(dsaved.metadata.at("slimquant.dynamic_layers"), std::to_string(dbest.dynamic.size()));
  EXPECT_NEAR(mode_sqnr(dsaved, ptq->float_graph(), *data, true), dbest.metric, 1e-9);
  std::cout << "resnet_small sqnr: " << top << " dynamic, the rest static " << top_dynamic << " dB, found in "
            << rd.candidates.size() << " candidates" << std::endl;

  // The saved model, layer by layer: weight-only layers as convert_weights_only writes them, the
  // others as the all-static convert.
  const ir::Graph saved = ir::load_onnx(r.model_path);
  EXPECT_EQ(saved.metadata.at("slimquant.mode"), "mixed");
  const ir::Graph st = ptq->convert();
  const ir::Graph wo = ptq->convert_weights_only();
  for (const auto& l : ptq->layers()) {
    const bool is_wo = std::find(best.weight_only.begin(), best.weight_only.end(), l.name) != best.weight_only.end();
    EXPECT_EQ(layer_form(saved, l.name), layer_form(is_wo ? wo : st, l.name)) << l.name;
  }
  EXPECT_NEAR(mode_sqnr(saved, ptq->float_graph(), *data, true), best.metric, 1e-9);

  // Our runtime and ONNX Runtime (pinned and latest) on the fixture's input, the weight-only and
  // the dynamic mix (ORT's u8 integer sums: onnx_runtime_integer_sums_exact).
  const std::string input = test::source_path("tests/fixtures/models/resnet_small.input.npy");
  if (!test::have_onnx_runtime()) GTEST_SKIP() << "Node.js / onnxruntime-node not installed";
  for (const std::string& path : {r.model_path, rd.model_path}) {
    const Tensor ours = mode_logits(path, input);
    const float bound = path == rd.model_path && !test::onnx_runtime_integer_sums_exact() ? 0.15f : 0.02f;
    for (const char* package : {"onnxruntime-node", "onnxruntime-node-latest"}) {
      const Tensor ort = test::onnx_runtime_logits(package, path, input, tmp.path(std::string("ort_") + package));
      ASSERT_EQ(ort.numel(), ours.numel()) << package;
      float range = 0;
      const float worst = worst_difference(ours, ort, &range);
      std::cout << path << " in " << package << ": worst |ours - ORT| " << worst << " of range " << range << std::endl;
      EXPECT_LT(worst, bound * range) << path << " in " << package;
    }
  }
}

// The CLI: --fallback-mode weight-only on vit_small meets a target with fewer float layers than the
// float fallback, and the printed quantize command (--node-mode LAYER=weight-only) rebuilds the
// saved model byte for byte.
TEST(AnalyzeCli, FallbackModeWeightOnlyReproducesWithNodeMode) {
  test::TempDir tmp("cli_fallback_mode");
  const std::string common = "analyze " + test::fixture_model("vit_small") +
                             " fashion-mnist:test --limit 256 --metric sqnr --algo abs_max --weight-bits 8 "
                             "--num-histogram-plots 0 --target-metric 44 --json --save-dir ";
  auto f = test::run_cli_single_threaded(common + tmp.path("float"));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  // The weight-only fallback from the YAML file's key (the flag overrides it; parsed by the same function).
  const std::string config = tmp.path("fallback.yaml");
  std::ofstream(config) << "fallback_mode: weight-only\n";
  auto w = test::run_cli_single_threaded(common + tmp.path("wo") + " --config " + config);
  ASSERT_EQ(w.exit_code, 0) << w.output;
  const auto jf = test::last_json_line(f.output)["target"];
  const auto jw = test::last_json_line(w.output)["target"];
  ASSERT_TRUE(jf["met"].get<bool>() && jw["met"].get<bool>());
  EXPECT_EQ(jf["fallback_mode"], "float");
  EXPECT_EQ(jw["fallback_mode"], "weight-only");
  EXPECT_TRUE(jf["weight_only"].empty());
  EXPECT_FALSE(jw["weight_only"].empty());
  EXPECT_LT(jw["skipped"].size(), jf["skipped"].size());
  for (const auto& l : jw["weight_only"]) EXPECT_EQ(jw["layer_modes"][l.get<std::string>()], "weight-only");
  const std::string command = jw["command"];
  EXPECT_NE(command.find("=weight-only"), std::string::npos) << command;
  auto q = test::run_cli_single_threaded(command.substr(std::string("slimquant ").size()));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_EQ(test::file_bytes(tmp.path("wo/target_model.onnx")), test::file_bytes(tmp.path("wo/target_model_requantized.onnx")));
  auto bad = test::run_cli_single_threaded("quantize " + test::fixture_model("vit_small") +
                                           " fashion-mnist:test --limit 32 --node-mode MatMul -o " + tmp.path("x.onnx"));
  EXPECT_EQ(bad.exit_code, 5) << bad.output;
  std::ofstream(config) << "fallback_mode: int4\n";
  auto bad_key = test::run_cli_single_threaded(common + tmp.path("bad") + " --config " + config);
  EXPECT_NE(bad_key.exit_code, 0);
  EXPECT_NE(bad_key.output.find("fallback mode must be float, weight-only or dynamic, got 'int4'"), std::string::npos)
      << bad_key.output;
}

}  // namespace
