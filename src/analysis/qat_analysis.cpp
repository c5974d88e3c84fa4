#include "slimquant/analysis/qat_analysis.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <unordered_set>

#include "slimquant/analysis/checkpoint.h"
#include "analysis/model_sweep.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/op_spec.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::analysis {

namespace {

std::set<std::string> onnx_types(const std::vector<std::string>& names) {
  std::set<std::string> out;
  for (const auto& n : names)
    for (const auto& t : quant::onnx_op_types_for(n)) out.insert(t);
  return out;
}

// Names a float tensor may have had before a tool quantized it.
std::vector<std::string> name_candidates(const std::string& name) {
  static const std::vector<std::string> kSuffixes = {"_QuantizeLinear_Output", "_DequantizeLinear_Output", "_quantized",
                                                     "_dequantized", "_quant", "_int8", "_q", "_dq", ".quantized"};
  std::vector<std::string> out{name};
  for (const auto& s : kSuffixes)
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      out.push_back(name.substr(0, name.size() - s.size()));
  return out;
}

const ir::Node* producer_node(const ir::Graph& g, const std::string& v) {
  int p = g.producer(v);
  return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
}

const Tensor* float_match(const ir::Graph& f, const std::string& name, const Shape& shape) {
  const Tensor* t = f.initializer(name);
  return t && t->dtype() == DType::kFloat32 && t->shape() == shape ? t : nullptr;
}

[[noreturn]] void wrong_float_model(const std::string& what) {
  fail(ErrorKind::kInvalidArgument,
       what + ": the float model does not match the quantized model (is it the model this one was quantized from?)");
}

// The first integer attribute (strides, group, kernel_shape, ...) both nodes set to different values.
std::string differing_int_attribute(const ir::Node& a, const ir::Node& b) {
  for (const auto& [key, value] : a.attrs) {
    auto it = b.attrs.find(key);
    if (it == b.attrs.end()) continue;
    if (const auto* x = std::get_if<int64_t>(&value)) {
      if (const auto* y = std::get_if<int64_t>(&it->second); y && *x != *y) return key;
    } else if (const auto* xs = std::get_if<std::vector<int64_t>>(&value)) {
      if (const auto* ys = std::get_if<std::vector<int64_t>>(&it->second); ys && *xs != *ys) return key;
    }
  }
  return "";
}

size_t count_op(const ir::Graph& g, const std::string& op_type) {
  return static_cast<size_t>(
      std::count_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.op_type == op_type; }));
}

// The float model must be the quantized model's source: the same graph inputs and outputs.
void check_same_interface(const ir::Graph& quant, const ir::Graph& flt) {
  std::vector<std::string> qi, fi;
  for (const auto& in : quant.inputs)
    if (!quant.is_initializer(in.name)) qi.push_back(in.name);
  for (const auto& in : flt.inputs)
    if (!flt.is_initializer(in.name)) fi.push_back(in.name);
  for (const auto& name : qi)
    if (std::find(fi.begin(), fi.end(), name) == fi.end())
      wrong_float_model("the quantized model's input '" + name + "' is not an input of the float model");
  for (const auto& name : fi)
    if (std::find(qi.begin(), qi.end(), name) == qi.end())
      wrong_float_model("the float model's input '" + name + "' is not an input of the quantized model");
  if (quant.outputs.size() != flt.outputs.size())
    wrong_float_model("the quantized model has " + std::to_string(quant.outputs.size()) + " outputs, the float model " +
                      std::to_string(flt.outputs.size()));
  for (size_t i = 0; i < quant.outputs.size(); ++i)
    if (quant.outputs[i].name != flt.outputs[i].name)
      wrong_float_model("output " + std::to_string(i) + " is '" + quant.outputs[i].name + "' in the quantized model but '" +
                        flt.outputs[i].name + "' in the float model");
}

}  // namespace

std::vector<QatLayer> find_quantized_layers(const ir::Graph& quant, const std::vector<std::string>& quantizable_op_type) {
  ir::Graph g = quant;
  ir::name_nodes(g);  // the PTQ's layer names
  const std::set<std::string> types = onnx_types(quantizable_op_type);
  const ir::GraphIndex ix(g);
  std::vector<QatLayer> out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& node = g.nodes[i];
    if (!types.count(node.op_type)) continue;
    // What a quantized layer is, the lowering selector says (one definition for both).
    if (std::optional<quant::QuantizedLayerMatch> m = quant::match_quantized_layer(ix, static_cast<int>(i)))
      out.push_back(QatLayer{node.name, node.op_type, std::move(m->activations), {}});
  }
  return out;
}

ir::Graph dequantize_layers(const ir::Graph& quant, const ir::Graph& float_graph, const std::set<std::string>& layers,
                            std::vector<QatLayer>* info) {
  ir::Graph g = quant;
  ir::name_nodes(g);  // the PTQ's layer names
  std::set<std::string> pending = layers;
  std::map<std::string, int> seen_of_type;  // running count per op type, for position matching
  std::vector<ir::Node> new_nodes;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const int position = seen_of_type[g.nodes[ni].op_type]++;
    if (!pending.erase(g.nodes[ni].name)) continue;
    ir::Node& node = g.nodes[ni];
    QatLayer layer{node.name, node.op_type, {}, {}};
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const std::string in = node.inputs[k];
      const ir::Node* dq = in.empty() ? nullptr : producer_node(g, in);
      if (!dq || dq->op_type != "DequantizeLinear") continue;
      const std::string xq = dq->inputs.at(0);
      const ir::Node* q = producer_node(g, xq);
      std::vector<std::string> names;
      Shape shape;
      if (q && q->op_type == "QuantizeLinear") {
        const std::string& src = q->inputs.at(0);
        if (!g.is_initializer(src)) {  // an activation: read it before its Q/DQ pair
          layer.activations.push_back(src);
          node.inputs[k] = src;
          continue;
        }
        shape = g.initializer(src)->shape();  // float weight fake-quantized by Q -> DQ
        names = name_candidates(src);
      } else if (g.is_initializer(xq)) {
        shape = g.initializer(xq)->shape();
        names = name_candidates(xq);
      } else {
        continue;  // DQ of something computed: not a constant we can restore
      }
      for (const auto& c : name_candidates(in)) names.push_back(c);
      // By name first (with the usual quantizer suffixes removed); a float tensor of that name
      // with another shape means the float model is not this model's source.
      const Tensor* restored = nullptr;
      std::string source, restored_name;
      const std::string where = "layer '" + node.name + "' (" + node.op_type + ") weight '" + xq + "' " + shape_str(shape);
      for (const auto& n : names) {
        const Tensor* t = float_graph.initializer(n);
        if (!t) continue;
        if (!(restored = float_match(float_graph, n, shape)))
          wrong_float_model(where + ": the float model's '" + n + "' is " + dtype_name(t->dtype()) + shape_str(t->shape()));
        source = "name:" + n;
        restored_name = n;
        break;
      }
      if (!restored) {
        // Exporter names that match nothing (ONNX Runtime's onnx::W_k): by position among the nodes
        // of this op type, only where both models have the same nodes of that type.
        const size_t in_quant = count_op(g, node.op_type), in_float = count_op(float_graph, node.op_type);
        if (in_quant != in_float)
          wrong_float_model(where + " has no float tensor of its name, and matching by position needs the same " +
                            node.op_type + " nodes, but the quantized model has " + std::to_string(in_quant) +
                            " and the float model " + std::to_string(in_float));
        int count = 0;
        for (const auto& fn : float_graph.nodes) {
          if (fn.op_type != node.op_type || count++ != position) continue;
          const Tensor* t = k < fn.inputs.size() ? float_graph.initializer(fn.inputs[k]) : nullptr;
          if (!t)
            wrong_float_model(where + ": the float model's " + node.op_type + " #" + std::to_string(position) + " ('" +
                              fn.name + "') has no constant input " + std::to_string(k));
          if (!(restored = float_match(float_graph, fn.inputs[k], shape)))
            wrong_float_model(where + ": the float model's " + node.op_type + " #" + std::to_string(position) +
                              " input '" + fn.inputs[k] + "' is " + dtype_name(t->dtype()) + shape_str(t->shape()));
          if (const std::string a = differing_int_attribute(fn, node); !a.empty())
            wrong_float_model(where + ": the float model's " + node.op_type + " #" + std::to_string(position) + " ('" +
                              fn.name + "') has another " + a);
          source = "position:" + node.op_type + " #" + std::to_string(position) + " input " + std::to_string(k);
          restored_name = fn.inputs[k];
          break;
        }
      }
      if (!restored) wrong_float_model(where + ": the float model has no matching weight");
      // Keep the float model's name when free: it is what users recognise.
      std::string name = restored_name;
      if (g.is_initializer(name) || g.producer(name) >= 0 || g.find_value_info(name))
        name = g.unique_value_name(restored_name + "_float");
      g.initializers[name] = *restored;
      node.inputs[k] = name;
      layer.restored.push_back(source);
    }
    if (info) info->push_back(std::move(layer));
  }
  if (!pending.empty())
    fail(ErrorKind::kInvalidArgument, "layer '" + *pending.begin() + "' is not a node of the quantized model");
  // The Q/DQ nodes nobody reads any more, and their constants, go.
  g.remove_dead_nodes();
  g.remove_unused_initializers();
  g.validate();
  return g;
}

namespace {

// What both forms of the QAT analysis start from: the graphs as compared, the layers, their
// de-quantized variants and the checkpoint fingerprint.
struct QatSetup {
  ir::Graph quant, float_model;
  std::vector<LayerVariant> variants;
  nlohmann::json restored = nlohmann::json::object();
  SweepOptions sweep;
};

QatSetup prepare_qat(const ir::Graph& quant, const ir::Graph& float_model, const QatAnalysisOptions& options) {
  {
    std::error_code ec;
    std::filesystem::create_directories(options.save_dir, ec);
    SQ_CHECK(std::filesystem::is_directory(options.save_dir), ErrorKind::kIo,
             "cannot create save_dir '" + options.save_dir + "'" + (ec ? ": " + ec.message() : std::string()));
  }
  QatSetup s;
  s.quant = quant;
  ir::constants_to_initializers(s.quant);
  name_nodes(s.quant);
  s.float_model = float_model;
  runtime::optimize_graph(s.float_model);  // BatchNorm folded, as PTQ folds it before quantizing
  check_same_interface(s.quant, s.float_model);  // a wrong --float-model fails here or by its first mismatching weight
  std::vector<QatLayer> layers = find_quantized_layers(s.quant, options.quantizable_op_type);
  std::string types;
  for (const auto& t : options.quantizable_op_type) types += (types.empty() ? "" : ",") + t;
  SQ_CHECK(!layers.empty(), ErrorKind::kInvalidArgument,
           "the quantized model has no quantized layer of types " + types +
               " (a layer is quantized when it reads a DequantizeLinear output): is it a QDQ model?");
  for (const auto& l : layers) {
    std::vector<QatLayer> info;
    s.variants.push_back({l.name, l.op_type, dequantize_layers(s.quant, s.float_model, {l.name}, &info)});
    s.restored[l.name] = info.at(0).restored;
  }
  s.sweep.batch_size = options.batch_size;
  s.sweep.checkpoint_path = options.checkpoint_name.empty()
                                ? std::string()
                                : (std::filesystem::path(options.save_dir) / options.checkpoint_name).string();
  s.sweep.fingerprint = {{"kind", "qat"},
                         {"quant_model", hash_hex(ir::serialize_onnx(s.quant))},
                         {"float_model", hash_hex(ir::serialize_onnx(s.float_model))},
                         {"quantizable_op_type", types}};
  for (const auto& [k, v] : options.fingerprint_extra.items()) s.sweep.fingerprint[k] = v;
  s.sweep.resume = options.resume;
  s.sweep.num_threads = options.num_threads;
  s.sweep.progress_label = "analyze-qat";
  return s;
}

SensitivityReport qat_report(const QatSetup& s, const SweepResult& sweep, const Metric& metric,
                             const QatAnalysisOptions& options) {
  const double baseline = options.qat_metric.value_or(sweep.base_metric);
  SensitivityReport report = rank_layers("qat", s.variants, sweep, metric, baseline);
  report.extra["qat_metric_given"] = options.qat_metric.has_value();
  report.extra["layers_total"] = s.variants.size();
  report.extra["restored_weights"] = s.restored;
  return report;
}

}  // namespace

SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model, const data::Dataset& data,
                              const Metric& metric, const QatAnalysisOptions& options) {
  QatSetup s = prepare_qat(quant, float_model, options);
  SweepResult sweep = sweep_layers(s.quant, s.variants, data, metric, &s.float_model, s.sweep);
  SensitivityReport report = qat_report(s, sweep, metric, options);
  report.extra["quant_model_metric"] = sweep.base_metric;
  report.extra["data"] = data.name();
  write_report(report, options.save_dir);
  return report;
}

SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model, const UserMetric& metric,
                              const QatAnalysisOptions& options) {
  SQ_CHECK(static_cast<bool>(metric.evaluate), ErrorKind::kInvalidArgument, "the user metric has no evaluate function");
  QatSetup s = prepare_qat(quant, float_model, options);
  s.sweep.fingerprint["metric"] = metric.name;
  std::vector<ModelSweepLayer> layers;
  for (const auto& v : s.variants) layers.push_back({v.layer, v.op_type, [&v] { return v.graph; }});
  // The quantized model itself is evaluated only when its metric is not given.
  std::function<ir::Graph()> base;
  if (!options.qat_metric) base = [&s] { return s.quant; };
  SweepResult sweep = sweep_models(base, layers, [&](const ir::Graph& model, bool) { return metric.evaluate(model); }, s.sweep);
  SensitivityReport report = qat_report(s, sweep, *direction_only_metric(metric.name, metric.higher_is_better), options);
  report.extra["quant_model_metric"] = base ? nlohmann::json(sweep.base_metric) : nlohmann::json();
  write_report(report, options.save_dir);
  return report;
}

SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model,
                              const std::function<double(runtime::Session&)>& eval_function, bool higher_is_better,
                              const QatAnalysisOptions& options) {
  SQ_CHECK(static_cast<bool>(eval_function), ErrorKind::kInvalidArgument, "eval_function is empty");
  UserMetric metric;
  metric.higher_is_better = higher_is_better;
  metric.evaluate = [&](const ir::Graph& model) {
    ir::Graph g = model;
    prepare_for_sweep(g);
    runtime::Session session(std::move(g));
    return eval_function(session);
  };
  return analyze_qat(quant, float_model, metric, options);
}

}  // namespace slimquant::analysis
