#include "slimquant/quant/precision_fallback.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

double output_sqnr_db(const std::map<std::string, Tensor>& reference, const std::map<std::string, Tensor>& quantized) {
  auto db = [](double signal, double noise) {
    if (noise == 0) return 200.0;  // identical: the cap the analysis reports for FP32 itself
    if (signal == 0) return -200.0;
    return std::min(200.0, 10.0 * std::log10(signal / noise));
  };
  double signal = 0, noise = 0, worst = 200.0;
  bool any_signal = false;
  for (const auto& [name, r] : reference) {
    auto it = quantized.find(name);
    if (it == quantized.end() || r.dtype() != DType::kFloat32 || it->second.dtype() != DType::kFloat32 ||
        r.shape() != it->second.shape())
      continue;
    const float* a = r.data<float>();
    const float* b = it->second.data<float>();
    double s = 0, n = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      s += static_cast<double>(a[i]) * a[i];
      const double d = static_cast<double>(a[i]) - b[i];
      n += d * d;
    }
    signal += s, noise += n;
    if (s > 0) worst = std::min(worst, db(s, n)), any_signal = true;
  }
  // The worst output: outputs differ in scale (Silero VAD's speech probability beside its LSTM
  // states, 128 values each), and pooled, the small one's drift would not show. Outputs that are
  // all zeros in FP32 count only when every output is.
  return any_signal ? worst : db(signal, noise);
}

std::set<std::string> PrecisionFallbackResult::quantized_layers(const PTQ& ptq) const {
  std::set<std::string> out;
  for (const Layer* l : ptq.all_layers())
    if (std::find(float_layers.begin(), float_layers.end(), l->name) == float_layers.end()) out.insert(l->name);
  return out;
}

// Probabilities near 0 and 1 hide the logit errors that change a decision (PP-OCRv4 rec: two
// fallback choices of equal probability SQNR differed by 8 points of exact match).
const ir::Node* softmax_writing(const ir::Graph& g, const std::string& output) {
  int p = g.producer(output);
  // Seen through: the Reshape of an opset < 13 Softmax on rank > 2, as the opset upgrade writes it
  // (Reshape(Softmax(Flatten(x)))), and the Casts of a float16 model's output.
  for (int step = 0; step < 4 && p >= 0; ++step) {
    const ir::Node& n = g.nodes[static_cast<size_t>(p)];
    if (n.op_type != "Reshape" && n.op_type != "Cast") break;
    p = g.producer(n.input(0));
  }
  if (p < 0) return nullptr;
  const ir::Node& n = g.nodes[static_cast<size_t>(p)];
  return n.op_type == "Softmax" || n.op_type == "LogSoftmax" ? &n : nullptr;
}

namespace {

// Ops whose result is a data-dependent choice of elements (a detector's score threshold, top-k and
// non-maximum suppression): FP32 and INT8 may choose different elements or a different number.
bool selects_elements(const std::string& op) {
  return op == "NonZero" || op == "NonMaxSuppression" || op == "TopK" || op == "Compress" || op == "Unique";
}


// The element type of every value the graph computes: as the file or shape inference states it,
// else as op types tell it (intermediate values mostly carry none after loading): comparisons give
// bool, index ops int64, Cast and ConstantOfShape what they say, every other op its data input's.
// A Cast's target type; kUndefined for one that is not a dtype here (float16: converted on load).
DType cast_target(const ir::Node& cast) {
  try {
    return dtype_from_onnx(static_cast<int>(cast.attr_int("to", 0)));
  } catch (const Error&) {
    return DType::kUndefined;
  }
}

std::map<std::string, DType> value_dtypes(const ir::Graph& g) {
  static const std::set<std::string> kBoolOps = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual",
                                                 "And", "Or", "Xor", "Not", "IsNaN", "IsInf"};
  static const std::set<std::string> kIndexOps = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin", "NonMaxSuppression"};
  std::map<std::string, DType> dtypes;
  for (const auto& in : g.inputs) dtypes[in.name] = in.dtype;
  for (const auto& [name, t] : g.initializers) dtypes[name] = t.dtype();
  auto of = [&](const std::string& v) {
    const auto it = dtypes.find(v);
    return it == dtypes.end() ? DType::kUndefined : it->second;
  };
  for (const auto& n : g.nodes) {
    DType out = DType::kUndefined;
    if (kBoolOps.count(n.op_type)) out = DType::kBool;
    else if (kIndexOps.count(n.op_type)) out = DType::kInt64;
    else if (n.op_type == "Cast") out = cast_target(n);
    else if (n.op_type == "Constant" || n.op_type == "ConstantOfShape")
      out = n.attr_tensor("value") ? n.attr_tensor("value")->dtype() : DType::kFloat32;
    else if (!n.inputs.empty()) out = of(n.op_type == "Where" && n.inputs.size() > 1 ? n.inputs[1] : n.inputs[0]);
    for (size_t i = 0; i < n.outputs.size(); ++i)
      dtypes[n.outputs[i]] = n.op_type == "TopK" && i == 1 ? DType::kInt64 : out;
  }
  for (const auto& [name, info] : g.value_info)  // what the file or shape inference states
    if (info.dtype != DType::kUndefined) dtypes[name] = info.dtype;
  for (const auto& out : g.outputs)
    if (out.dtype != DType::kUndefined) dtypes[out.name] = out.dtype;
  return dtypes;
}

bool is_integer_or_bool(DType t) {
  return t == DType::kBool || t == DType::kInt64 || t == DType::kInt32 || t == DType::kInt16 || t == DType::kInt8 ||
         t == DType::kUInt8 || t == DType::kUInt32 || t == DType::kUInt64;
}

struct MeasuredValues {
  std::vector<std::string> values;
  bool substituted = false;  // an output is measured at what it was computed from
};

// `dtypes`: value_dtypes(g).
MeasuredValues measured_values(const ir::Graph& g, const std::map<std::string, DType>& dtypes) {
  // Values computed from a selection (selected), and values computed from what the graph inputs
  // hold (the others come from constants and shapes alone: anchors, image sizes).
  std::set<std::string> selected, from_inputs;
  for (const auto& in : g.inputs)
    if (!g.is_initializer(in.name)) from_inputs.insert(in.name);
  for (const auto& n : g.nodes) {
    const bool reads_shape_only = n.op_type == "Shape" || n.op_type == "Size";
    bool after_selection = selects_elements(n.op_type), reads_inputs = false;
    for (const auto& v : n.inputs) {
      after_selection = after_selection || selected.count(v);
      reads_inputs = reads_inputs || (!reads_shape_only && from_inputs.count(v));
    }
    for (const auto& v : n.outputs) {
      if (after_selection) selected.insert(v);
      if (reads_inputs) from_inputs.insert(v);
    }
  }
  // Integer and boolean values are decisions (an ArgMax's classes, a threshold's mask), not
  // measurements: an output of them is measured at the float values it was decided from.
  auto decided = [&](const std::string& v) {
    const auto it = dtypes.find(v);
    return it != dtypes.end() && is_integer_or_bool(it->second);
  };
  MeasuredValues result;
  std::vector<std::string>& values = result.values;
  auto measure = [&](const std::string& v) {
    const ir::Node* softmax = softmax_writing(g, v);
    const std::string& measured = softmax ? softmax->input(0) : v;
    if (std::find(values.begin(), values.end(), measured) == values.end()) values.push_back(measured);
  };
  // An output after a selection is measured at the dense values the selection chose from (the
  // scores and boxes of every anchor, the feature maps a RoiAlign reads): elementwise comparison
  // of two different choices would measure the choice, not the quantization. An output that is a
  // decision likewise, at the values decided from (an ArgMax's logits).
  std::set<std::string> visited;
  std::vector<std::string> pending;
  for (const auto& out : g.outputs) {
    if (!selected.count(out.name) && !decided(out.name)) {
      measure(out.name);
      continue;
    }
    result.substituted = true;
    pending.push_back(out.name);
    while (!pending.empty()) {
      const std::string v = pending.back();
      pending.pop_back();
      const int p = g.producer(v);
      if (p < 0 || !visited.insert(v).second) continue;
      const ir::Node& n = g.nodes[static_cast<size_t>(p)];
      if (n.op_type == "Shape" || n.op_type == "Size") continue;  // its input gives only a shape
      for (const auto& in : n.inputs) {
        if (in.empty()) continue;
        if (selected.count(in) || decided(in))
          pending.push_back(in);
        else if (from_inputs.count(in) && g.producer(in) >= 0)  // computed, not fed
          measure(in);
      }
    }
  }
  return result;
}

}  // namespace

std::vector<std::string> drift_measured_values(const ir::Graph& g) {
  return measured_values(g, value_dtypes(g)).values;
}

std::vector<std::string> selection_inputs(const ir::Graph& g) {
  const std::map<std::string, DType> dtypes = value_dtypes(g);
  MeasuredValues m = measured_values(g, dtypes);
  if (!m.substituted) return {};
  std::erase_if(m.values, [&](const std::string& v) {
    const auto it = dtypes.find(v);
    return it == dtypes.end() || it->second != DType::kFloat32;
  });
  return m.values;
}

ir::Graph join_measured_values(ir::Graph g, const std::vector<std::string>& values) {
  SQ_CHECK(!values.empty(), ErrorKind::kInvalidArgument, "join_measured_values: no values to join");
  std::set<std::string> computed;
  for (const auto& n : g.nodes) computed.insert(n.outputs.begin(), n.outputs.end());
  ir::ValueNames names(g);
  SQ_CHECK(names.fresh(kJoinedMeasuredValues) == kJoinedMeasuredValues, ErrorKind::kInvalidArgument,
           std::string("join_measured_values: the model already has a value '") + kJoinedMeasuredValues + "'");
  const std::string flat = names.fresh("slimquant_flat");
  g.initializers[flat] = Tensor::from_vector<int64_t>({2}, {1, -1});  // one row per run
  ir::Node concat;
  concat.op_type = "Concat";
  concat.name = std::string(kJoinedMeasuredValues);
  concat.attrs["axis"] = int64_t{1};
  for (size_t i = 0; i < values.size(); ++i) {
    SQ_CHECK(computed.count(values[i]), ErrorKind::kInvalidArgument,
             "join_measured_values: '" + values[i] + "' is not computed");
    ir::Node reshape;
    reshape.op_type = "Reshape";
    reshape.name = names.fresh(values[i] + "_flat");
    reshape.inputs = {values[i], flat};
    reshape.outputs = {reshape.name};
    concat.inputs.push_back(reshape.name);
    g.nodes.push_back(std::move(reshape));
  }
  concat.outputs = {std::string(kJoinedMeasuredValues)};
  g.nodes.push_back(std::move(concat));
  g.outputs = {{std::string(kJoinedMeasuredValues), DType::kFloat32, std::nullopt}};
  g.remove_dead_nodes();
  g.remove_unused_initializers();
  return g;
}

namespace {

// Noise power and signal power of a value.
struct NoiseSum {
  double noise = 0, signal = 0;
  double ratio() const { return signal > 0 ? noise / signal : (noise > 0 ? 1.0 : 0.0); }
};

// Up to this many elements of each value, at a fixed stride, stand for the whole value: enough for
// a noise ratio, and the float pass keeps only these (a 1024x1024 network's activations do not fit).
constexpr int64_t kProbedElements = 4096;

// The layers ranked by the noise each adds in context: the float reference pass keeps a strided
// sample of every layer's input and output values (keep_in), one pass of the quantized model
// measures its noise ratio on the same elements (compare_in), and a layer's score is the noise ratio
// of its output minus the largest of its quantized inputs' (what its own input and weight rounding
// added to what reached it).
class AddedNoise {
 public:
  explicit AddedNoise(const PTQ& ptq) : ptq_(ptq) {
    for (const auto& n : ptq.float_graph().nodes) output_of_[n.name] = n.outputs.empty() ? "" : n.outputs[0];
    // Layers inside If branches have no values here: they rank last.
    for (const Layer* l : ptq.all_layers()) {
      for (const auto& a : l->activations) probes_[a];
      if (!output_of_[l->name].empty()) probes_[output_of_[l->name]];
    }
  }

  void keep_in(runtime::RunOptions& run) {
    visit_probed(run, ptq_.float_graph(), [](const std::string&, std::vector<float>& kept, const float* x, int64_t n, int64_t stride) {
      for (int64_t i = 0; i < n; i += stride) kept.push_back(x[i]);
    });
  }

  // `quantized`: the graph the run executes. A probed value it no longer has (a Relu / Clip output
  // the ONNX Runtime form folds into its QuantizeLinear) is not measured.
  void compare_in(runtime::RunOptions& run, const ir::Graph& quantized) {
    visit_probed(run, quantized, [this](const std::string& name, std::vector<float>& kept, const float* x, int64_t n,
                             int64_t stride) {
      NoiseSum& sum = noise_[name];
      size_t k = 0;
      for (int64_t i = 0; i < n && k < kept.size(); i += stride, ++k) {
        const double ref = kept[k], d = ref - x[i];
        sum.noise += d * d;
        sum.signal += ref * ref;
      }
    });
  }

  // (minus the added noise ratio, layer): most added noise first after an ascending sort.
  std::vector<std::pair<double, std::string>> ranking() {
    std::vector<std::pair<double, std::string>> out;
    for (const Layer* l : ptq_.all_layers()) {
      double before = 0;
      for (const auto& a : l->activations) before = std::max(before, noise_[a].ratio());
      const std::string& value = output_of_[l->name];
      out.push_back({before - (value.empty() ? 0.0 : noise_[value].ratio()), l->name});
    }
    return out;
  }

 private:
  // Observes every probed value of `g` in `run`; `visit(name, its kept elements, values, count, stride)`.
  template <typename Visit>
  void visit_probed(runtime::RunOptions& run, const ir::Graph& g, Visit visit) {
    for (const auto& [name, v] : probes_)
      if (g.producer(name) >= 0 ||
          std::any_of(g.inputs.begin(), g.inputs.end(), [&](const ir::ValueInfo& in) { return in.name == name; }))
        run.observe.push_back(name);
    run.on_value = [this, visit](const std::string& name, const Tensor& value) {
      auto p = probes_.find(name);
      if (p == probes_.end() || value.dtype() != DType::kFloat32) return;
      visit(name, p->second, value.data<float>(), value.numel(), std::max<int64_t>(1, value.numel() / kProbedElements));
    };
  }
  const PTQ& ptq_;
  std::map<std::string, std::string> output_of_;       // layer -> its output value
  std::map<std::string, std::vector<float>> probes_;  // value -> the float elements kept
  std::map<std::string, NoiseSum> noise_;             // value -> its noise in the quantized model
};

}  // namespace

PrecisionFallbackResult choose_precision_fallback(PTQ& ptq, const std::map<std::string, Tensor>& all_samples,
                                                  const PrecisionFallbackOptions& options) {
  PrecisionFallbackResult result;
  const std::vector<const Layer*> layers = ptq.all_layers();  // those inside If branches one by one
  if (options.target_sqnr_db <= 0 || layers.empty()) return result;
  const auto budget = static_cast<size_t>(std::ceil(options.max_float_fraction * static_cast<double>(layers.size())));
  // The exact ranking's evaluations: reference, before, channel-wise, one per layer, up to one per
  // float layer; the other's: reference, before, channel-wise, the probe pass, doubling groups.
  const runtime::BatchAxes batch_axes = runtime::input_batch_axes(ptq.float_graph().inputs);
  const int64_t available = std::max<int64_t>(1, runtime::batch_rows(all_samples, batch_axes));
  const size_t exact_runs = (3 + layers.size() + std::min(budget, layers.size())) * static_cast<size_t>(available);
  const bool exact = options.max_sample_runs == 0 || exact_runs <= options.max_sample_runs;
  size_t noise_ranking_runs = 4;  // reference (which keeps the probes), before, channel-wise, the probe pass
  for (size_t k = 1; k < budget; k *= 2) ++noise_ranking_runs;
  ++noise_ranking_runs;  // the whole budget
  const int64_t used = exact ? available
                             : std::clamp<int64_t>(static_cast<int64_t>(options.max_sample_runs / noise_ranking_runs), 1,
                                                   available);
  const std::map<std::string, Tensor> samples =
      used == available ? all_samples : runtime::feed_rows(all_samples, 0, used, batch_axes);
  result.samples = static_cast<size_t>(used);
  result.ranking = exact ? "output" : "added noise";

  runtime::SessionOptions so;
  so.num_threads = 0;
  runtime::RunOptions compared;
  compared.outputs = drift_measured_values(ptq.float_graph());
  AddedNoise added_noise(ptq);
  runtime::RunOptions reference_run = compared;
  if (!exact) added_noise.keep_in(reference_run);
  const std::map<std::string, Tensor> reference = runtime::Session(ptq.float_graph(), so).run(samples, reference_run);
  auto sqnr_without = [&](const std::vector<std::string>& in_float) {
    PrecisionFallbackResult r;
    r.float_layers = in_float;
    ++result.evaluations;
    // Float simulation of the QDQ graph: the integer execution equals it within rounding.
    runtime::Session session(ptq.convert(r.quantized_layers(ptq)), so);
    return output_sqnr_db(reference, session.run(samples, compared));
  };
  result.sqnr_db_before = result.sqnr_db_after = sqnr_without({});
  if (result.sqnr_db_before >= options.target_sqnr_db) return result;
  result.triggered = true;
  result.sqnr_db_per_tensor = result.sqnr_db_before;
  if (!ptq.channel_abs_max().empty() && !ptq.channel_wise_conv_inputs()) {
    ptq.set_channel_wise_conv_inputs(true);
    const double channel_wise = sqnr_without({});
    if (channel_wise > result.sqnr_db_before) {
      result.channel_wise_conv_inputs = true;
      result.sqnr_db_before = result.sqnr_db_after = channel_wise;
      if (channel_wise >= options.target_sqnr_db) return result;
    } else {
      ptq.set_channel_wise_conv_inputs(false);
    }
  }

  std::vector<std::pair<double, std::string>> damage;
  if (exact) {
    // Rank: the output SQNR with each layer alone quantized, most damaging first. Leave-one-out
    // ranking (each layer alone in float) finds only the single worst layer on a model whose errors
    // compound: with everything else quantized, one more float layer barely moves the output
    // (PP-OCRv4 rec: it chose one layer, 80.5 exact; this ranking's five layers: within a point of FP32).
    Progress progress("fallback", layers.size(), "layers");
    for (const Layer* l : layers) {
      PrecisionFallbackResult only;
      for (const Layer* other : layers)
        if (other->name != l->name) only.float_layers.push_back(other->name);
      ++result.evaluations;
      runtime::Session session(ptq.convert(only.quantized_layers(ptq)), so);
      damage.push_back({output_sqnr_db(reference, session.run(samples, compared)), l->name});
      progress.advance();
    }
    progress.finish();
  } else {
    runtime::RunOptions probe;
    probe.outputs_needed = false;
    const ir::Graph quantized = ptq.convert();
    added_noise.compare_in(probe, quantized);
    runtime::Session(quantized, so).run(samples, probe);
    damage = added_noise.ranking();
  }
  std::stable_sort(damage.begin(), damage.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Exact: one layer more per step. Otherwise groups of 1, 2, 4, ... and the whole budget.
  std::vector<size_t> sizes;
  const size_t most = std::min(budget, damage.size());
  for (size_t k = 1; k <= most; k = exact ? k + 1 : k * 2) sizes.push_back(k);
  if (!exact && most > 0 && sizes.back() != most) sizes.push_back(most);
  double best = result.sqnr_db_before;
  for (size_t k : sizes) {
    std::vector<std::string> chosen;
    for (size_t i = 0; i < k; ++i) chosen.push_back(damage[i].second);
    const double s = sqnr_without(chosen);
    if (s > best) {
      best = s;
      result.float_layers = chosen;
    }
    if (best >= options.target_sqnr_db) break;
  }
  result.sqnr_db_after = best;
  return result;
}

}  // namespace slimquant::quant
