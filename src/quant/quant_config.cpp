#include "slimquant/quant/quant_config.h"

#include "quant/deploy_policy.h"


#include <fnmatch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

namespace slimquant::quant {

namespace {
bool matches(const std::string& pattern, const std::string& text) {
  return pattern == text || fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}
bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }
// Whether `op_type` is one of `names` (ONNX types or source names such as conv2d, mapped).
bool is_listed(const std::vector<std::string>& names, const std::string& op_type) {
  for (const auto& t : names)
    for (const auto& o : onnx_op_types_for(t))
      if (o == op_type) return true;
  return false;
}
}  // namespace

QuantConfig& QuantConfig::add_type_config(const std::vector<std::string>& op_types, QuantRule rule) {
  std::vector<std::string> mapped;
  for (const auto& t : op_types)
    for (const auto& o : onnx_op_types_for(t)) mapped.push_back(o);
  type_rules_.push_back({mapped, std::move(rule)});
  return *this;
}
QuantConfig& QuantConfig::add_name_config(const std::vector<std::string>& patterns, QuantRule rule) {
  name_rules_.push_back({patterns, std::move(rule)});
  return *this;
}
QuantConfig& QuantConfig::add_layer_config(const std::vector<std::string>& layers, QuantRule rule) {
  layer_rules_.push_back({layers, std::move(rule)});
  return *this;
}
QuantConfig& QuantConfig::add_qat_layer_mapping(const std::string& op_type, OpQuantSpec spec) {
  custom_specs_[op_type] = std::move(spec);
  if (!contains(quantizable_op_type, op_type)) quantizable_op_type.push_back(op_type);
  return *this;
}

const QuantRule& QuantConfig::rule_for(const ir::Node& node) const {
  // Later rules of the same level override earlier ones, as repeated add_*_config calls expect.
  for (auto it = layer_rules_.rbegin(); it != layer_rules_.rend(); ++it)
    if (contains(it->first, node.name)) return it->second;
  for (auto it = name_rules_.rbegin(); it != name_rules_.rend(); ++it)
    for (const auto& p : it->first)
      if (matches(p, node.name)) return it->second;
  for (auto it = type_rules_.rbegin(); it != type_rules_.rend(); ++it)
    if (contains(it->first, node.op_type)) return it->second;
  return global_;
}

bool QuantConfig::is_skipped(const ir::Node& node) const {
  for (const auto& p : skip_quant)
    if (p == node.op_type || matches(p, node.name)) return true;
  // An entry is a tensor or a layer (node) name: analysis.txt ranks layers by node name, and seed
  // 000 tells users to pass those names here.
  for (const auto& t : skip_tensor_list)
    if (t == node.name || contains(node.inputs, t) || contains(node.outputs, t)) return true;
  return false;
}

bool QuantConfig::calibrates() const {
  return needs_calibration(mode) ||
         std::any_of(node_modes.begin(), node_modes.end(), [](const auto& entry) { return needs_calibration(entry.second); });
}

QuantMode QuantConfig::mode_for(const ir::Node& node) const {
  for (auto it = node_modes.rbegin(); it != node_modes.rend(); ++it)
    if (it->first == node.op_type || matches(it->first, node.name)) return it->second;
  return mode;
}

DeployBackend parse_deploy_backend(const std::string& name) {
  if (name == "slimquant") return DeployBackend::kSlimquant;
  if (name == "onnxruntime") return DeployBackend::kOnnxRuntime;
  if (name == "tensorrt") return DeployBackend::kTensorRT;
  fail(ErrorKind::kInvalidArgument, "deploy_backend must be slimquant, onnxruntime or tensorrt, got '" + name + "'");
}

QuantMode parse_quant_mode(const std::string& name) {
  if (name == "static") return QuantMode::kStatic;
  if (name == "weight-only" || name == "weight_only") return QuantMode::kWeightOnly;
  if (name == "dynamic") return QuantMode::kDynamic;
  fail(ErrorKind::kInvalidArgument, "mode must be static, weight-only or dynamic, got '" + name + "'");
}

const char* quant_mode_name(QuantMode mode) {
  if (mode == QuantMode::kDynamic) return "dynamic";
  return mode == QuantMode::kWeightOnly ? "weight-only" : "static";
}

WeightRounding parse_weight_rounding(const std::string& name) {
  if (name == "rtn") return WeightRounding::kRtn;
  if (name == "gptq") return WeightRounding::kGptq;
  fail(ErrorKind::kInvalidArgument, "weight_rounding must be rtn or gptq, got '" + name + "'");
}

const char* weight_rounding_name(WeightRounding rounding) { return rounding == WeightRounding::kGptq ? "gptq" : "rtn"; }

Int4Activations parse_int4_activations(const std::string& name) {
  if (name == "float") return Int4Activations::kFloat;
  if (name == "int8") return Int4Activations::kInt8;
  fail(ErrorKind::kInvalidArgument, "int4_activations must be float or int8, got '" + name + "'");
}

const char* int4_activations_name(Int4Activations a) { return a == Int4Activations::kInt8 ? "int8" : "float"; }

namespace {
// block_size and weight_rounding gptq belong to weight-only 4-bit weights.
void check_blocked_weight_settings(const QuantConfig& c) {
  const std::string where;
  const bool four_bit_weight_only = c.mode == QuantMode::kWeightOnly && c.effective_weight_bits() == 4;
  if (c.block_size != 0) {
    if (c.block_size != 32 && c.block_size != 64 && c.block_size != 128)
      fail(ErrorKind::kInvalidArgument, where + "block_size must be 32, 64 or 128 (got " + std::to_string(c.block_size) + ")");
    if (!four_bit_weight_only)
      fail(ErrorKind::kInvalidArgument, where + "block_size sets the blocks of 4-bit weights: it needs mode weight-only "
                                                "and weight_bits 4 (mode is " + quant_mode_name(c.mode) +
                                                ", weight_bits " + std::to_string(c.effective_weight_bits()) + ")");
  }
  if (c.int4_activations == Int4Activations::kInt8 && !four_bit_weight_only)
    fail(ErrorKind::kInvalidArgument, where + "int4_activations int8 sets how 4-bit weights are multiplied: it needs "
                                              "mode weight-only and weight_bits 4 (mode is " + quant_mode_name(c.mode) +
                                              ", weight_bits " + std::to_string(c.effective_weight_bits()) + ")");
  if (c.weight_rounding == WeightRounding::kGptq && !four_bit_weight_only)
    fail(ErrorKind::kInvalidArgument, where + "weight_rounding gptq rounds 4-bit blocked weights: it needs mode "
                                              "weight-only and weight_bits 4 (mode is " + quant_mode_name(c.mode) +
                                              ", weight_bits " + std::to_string(c.effective_weight_bits()) + ")");
}
}  // namespace

const char* deploy_backend_name(DeployBackend backend) {
  switch (backend) {
    case DeployBackend::kSlimquant: return "slimquant";
    case DeployBackend::kOnnxRuntime: return "onnxruntime";
    case DeployBackend::kTensorRT: return "tensorrt";
  }
  return "?";
}

const OpQuantSpec* QuantConfig::spec_for(const ir::Node& node) const {
  if (!node.domain.empty() && !custom_specs_.count(node.op_type)) return nullptr;
  const OpQuantSpec* spec = nullptr;
  if (auto it = custom_specs_.find(node.op_type); it != custom_specs_.end()) spec = &it->second;
  else if (auto b = builtin_op_specs().find(node.op_type); b != builtin_op_specs().end()) spec = &b->second;
  if (!spec) return nullptr;
  if (!DeployPolicy::of(deploy_backend).quantizes(node, *spec, is_listed(quantizable_op_type, node.op_type), is_full_quantize))
    return nullptr;
  if (is_skipped(node) || !rule_for(node).quantize) return nullptr;
  return spec;
}

bool QuantConfig::quantizes_op_type(const std::string& op_type) const {
  const bool has_spec = custom_specs_.count(op_type) || builtin_op_specs().count(op_type);
  return has_spec && (is_full_quantize || is_listed(quantizable_op_type, op_type));
}

int QuantConfig::effective_weight_bits() const { return weight_bits != 0 ? weight_bits : 8; }

void QuantConfig::validate() const {
  if (weight_bits != 0 && (weight_bits < 2 || weight_bits > 8))
    fail(ErrorKind::kInvalidArgument,
         "weight_bits must be in [2, 8] (got " + std::to_string(weight_bits) + ")");
  check_blocked_weight_settings(*this);
  for (const auto& t : quantizable_op_type) {
    for (const auto& o : onnx_op_types_for(t)) {
      if (builtin_op_specs().count(o) || custom_specs_.count(o)) continue;
      std::string known;
      for (const auto& [op, spec] : builtin_op_specs()) known += (known.empty() ? "" : ", ") + op;
      fail(ErrorKind::kInvalidArgument, "quantizable_op_type: unknown op type '" + t +
                                            "' (known: " + known + ", the source names conv2d, depthwise_conv2d, mul, "
                                            "matmul, pool2d, elementwise_add, ..., or a type registered with "
                                            "add_qat_layer_mapping)");
    }
  }
}

std::vector<std::string> QuantConfig::unmatched_skips(const ir::Graph& graph) const {
  std::vector<std::string> out;
  auto matches_a_node = [&](const std::string& p) {
    return std::any_of(graph.nodes.begin(), graph.nodes.end(),
                       [&](const ir::Node& n) { return p == n.op_type || matches(p, n.name); });
  };
  for (const auto& p : skip_quant)
    if (!matches_a_node(p)) out.push_back("skip pattern '" + p + "' matches no op type or node name of the model");
  for (const auto& [p, m] : node_modes)
    if (!matches_a_node(p)) out.push_back("node_modes pattern '" + p + "' matches no op type or node name of the model");
  for (const auto& t : skip_tensor_list) {
    bool hit = false;
    for (const auto& n : graph.nodes) hit |= t == n.name || contains(n.inputs, t) || contains(n.outputs, t);
    if (!hit)
      out.push_back("skip_tensor_list entry '" + t + "' is neither a layer (node) name nor a tensor read or written "
                    "by a node of the model");
  }
  return out;
}

std::string QuantConfig::fingerprint() const {
  std::ostringstream os;
  auto rule = [&](const QuantRule& r) {
    os << r.activation << '/' << r.weight << '/' << r.quantize;
    if (!r.activation_quanter.empty() || !r.weight_quanter.empty()) os << '/' << r.activation_quanter << '/' << r.weight_quanter;
    os << ';';
  };
  rule(global_);
  for (const auto* rules : {&type_rules_, &name_rules_, &layer_rules_}) {
    os << '|';
    for (const auto& [keys, r] : *rules) {
      for (const auto& k : keys) os << k << ',';
      rule(r);
    }
  }
  os << "|ops:";
  for (const auto& t : quantizable_op_type) os << t << ',';
  os << "|full:" << is_full_quantize << "|skipt:";
  for (const auto& t : skip_tensor_list) os << t << ',';
  os << "|skipq:";
  for (const auto& t : skip_quant) os << t << ',';
  os << "|backend:" << deploy_backend_name(deploy_backend) << "|asym:" << asymmetric_activations << "|hist:" << observer_options.hist_percent << ',' << observer_options.bins
     << "|wbits:" << effective_weight_bits();
  if (mode != QuantMode::kStatic) os << "|mode:" << quant_mode_name(mode);  // static: as before modes existed
  if (!node_modes.empty()) {
    os << "|node_modes:";
    for (const auto& [pattern, m] : node_modes) os << pattern << '=' << quant_mode_name(m) << ',';
  }
  if (block_size != 0) os << "|block:" << block_size;
  if (weight_rounding != WeightRounding::kRtn) os << "|rounding:" << weight_rounding_name(weight_rounding);
  if (int4_activations != Int4Activations::kFloat)
    os << "|int4_activations:" << int4_activations_name(int4_activations);
  if (bias_correction) os << "|bias_correction";
  if (channel_wise_conv_inputs) os << "|channel_wise_conv_inputs";
  for (const auto& [op, spec] : custom_specs_) os << "|custom:" << op;
  return os.str();
}

namespace {

std::vector<std::string> string_list(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    // "Conv,MatMul" or a single name
    std::vector<std::string> out;
    std::stringstream ss(n.as<std::string>());
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) out.push_back(item);
    return out;
  }
  if (!n.IsSequence()) fail(ErrorKind::kInvalidArgument, "config key '" + key + "' must be a list of names");
  return n.as<std::vector<std::string>>();
}

QuantRule rule_from_yaml(const YAML::Node& n, const QuantRule& base, const std::string& where) {
  QuantRule r = base;
  for (const auto& kv : n) {
    const auto key = kv.first.as<std::string>();
    if (key == "algo" || key == "activation") r.activation = kv.second.as<std::string>();
    else if (key == "weight_quantize_type" || key == "weight") r.weight = kv.second.as<std::string>();
    else if (key == "quantize") r.quantize = kv.second.as<bool>();
    else if (key == "act_quanter" || key == "activation_quanter") r.activation_quanter = kv.second.as<std::string>();
    else if (key == "weight_quanter") r.weight_quanter = kv.second.as<std::string>();
    else fail(ErrorKind::kInvalidArgument, "unknown key '" + key + "' in " + where +
                                               " (known: algo, weight_quantize_type, quantize, act_quanter, weight_quanter)");
  }
  make_activation_observer(r.activation);  // validate names early, with the observers' own message
  make_weight_observer(r.weight);
  return r;
}

}  // namespace

QuantConfig load_quant_config_yaml(const std::string& path, QuantConfig cfg, std::map<std::string, std::string>* extra) {
  if (!std::filesystem::exists(path)) fail(ErrorKind::kIo, "config file '" + path + "' does not exist");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kInvalidArgument, "config file '" + path + "' is not valid YAML: " + e.what());
  }
  if (root.IsNull()) return cfg;
  if (!root.IsMap()) fail(ErrorKind::kInvalidArgument, "config file '" + path + "' must be a mapping of keys");
  static const std::set<std::string> kFlowKeys = {
      "batch_size", "batch_nums", "is_use_cache_file", "cache_dir", "model_dir", "model_filename",
      "params_filename", "save_dir", "checkpoint_name", "num_histogram_plots", "onnx_format", "optimize_model",
      "save_model_filename", "save_params_filename", "quant_model_dir",
      "float_model_dir", "fallback_sqnr_db", "qat_metric", "resume", "data", "dataset", "metric", "target_metric", "fallback_mode", "epochs", "lr",
      "optimizer", "weight_quanter", "act_quanter", "distill", "mean", "std", "resize", "channel_order", "limit",
      "temperature", "steps_per_epoch", "weight_decay", "momentum", "nesterov", "lr_schedule", "seed", "checkpoint"};
  // Every yaml-cpp exception (a key that is not a scalar, a value of the wrong type) becomes an
  // error naming the file, also in the ptq_config merge.
  try {
    // Some configs nest everything under ptq_config (as the analysis configs of the sources do).
    if (root["ptq_config"] && root["ptq_config"].IsMap()) {
      YAML::Node merged = YAML::Clone(root["ptq_config"]);
      for (const auto& kv : root)
        if (kv.first.as<std::string>() != "ptq_config") merged[kv.first.as<std::string>()] = kv.second;
      root = merged;
    }
    for (const auto& kv : root) {
      const auto key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "algo") cfg.global().activation = v.as<std::string>();
      else if (key == "weight_quantize_type") cfg.global().weight = v.as<std::string>();
      else if (key == "hist_percent") cfg.observer_options.hist_percent = v.as<float>();
      else if (key == "bins") cfg.observer_options.bins = v.as<int>();
      else if (key == "weight_bits") cfg.weight_bits = v.as<int>();
      else if (key == "deploy_backend") cfg.deploy_backend = parse_deploy_backend(v.as<std::string>());
      else if (key == "mode") cfg.mode = parse_quant_mode(v.as<std::string>());
      else if (key == "block_size") cfg.block_size = v.as<int>();
      else if (key == "weight_rounding") cfg.weight_rounding = parse_weight_rounding(v.as<std::string>());
      else if (key == "int4_activations") cfg.int4_activations = parse_int4_activations(v.as<std::string>());
      else if (key == "quantizable_op_type") cfg.quantizable_op_type = string_list(v, key);
      else if (key == "is_full_quantize") cfg.is_full_quantize = v.as<bool>();
      else if (key == "bias_correction") cfg.bias_correction = v.as<bool>();
      else if (key == "channel_wise_conv_inputs") cfg.channel_wise_conv_inputs = v.as<bool>();
      else if (key == "round_type") {
        const auto t = v.as<std::string>();
        if (t == "adaround")
          fail(ErrorKind::kUnsupported, "config file '" + path + "': round_type: adaround is not implemented (weights are "
                                        "rounded to nearest, round_type: round); for a model that loses accuracy, "
                                        "quantize's precision recovery (fallback_sqnr_db) and bias_correction: true are "
                                        "the remedies slimquant has (docs/quantization.md)");
        if (t != "round") fail(ErrorKind::kInvalidArgument, "config file '" + path + "': round_type must be round (got '" + t + "')");
      }
      else if (key == "skip_tensor_list") cfg.skip_tensor_list = string_list(v, key);
      else if (key == "skip_quant") cfg.skip_quant = string_list(v, key);
      else if (key == "node_modes") {
        if (!v.IsMap()) fail(ErrorKind::kInvalidArgument, "config key 'node_modes' must map node patterns to modes");
        for (const auto& entry : v)
          cfg.node_modes.emplace_back(entry.first.as<std::string>(), parse_quant_mode(entry.second.as<std::string>()));
      }
      else if (key == "activation_quantize_type") {
        cfg.asymmetric_activations = parse_activation_quantize_type(v.as<std::string>());
      } else if (key == "activation_bits") {
        const int bits = v.as<int>();
        if (bits != 8)
          fail(ErrorKind::kUnsupported, "config file '" + path + "': activation_bits must be 8 (got " +
                                            std::to_string(bits) + "): activations are quantized to 8 bits");
      } else if (key == "type_config" || key == "name_config" || key == "layer_config") {
        if (!v.IsMap()) fail(ErrorKind::kInvalidArgument, "config key '" + key + "' must map names to rules");
        for (const auto& entry : v) {
          const auto name = entry.first.as<std::string>();
          QuantRule r = rule_from_yaml(entry.second, cfg.global(), key + "." + name);
          if (key == "type_config") cfg.add_type_config({name}, r);
          else if (key == "name_config") cfg.add_name_config({name}, r);
          else cfg.add_layer_config({name}, r);
        }
      } else if (kFlowKeys.count(key)) {
        if (extra) (*extra)[key] = v.IsScalar() ? v.as<std::string>() : YAML::Dump(v);
      } else {
        fail(ErrorKind::kInvalidArgument, "unknown key '" + key + "' in config file '" + path + "'");
      }
    }
  } catch (const YAML::Exception& e) {
    fail(ErrorKind::kInvalidArgument, "config file '" + path + "': " + e.what());
  }
  make_activation_observer(cfg.global().activation, cfg.observer_options);  // bins, hist_percent too
  make_weight_observer(cfg.global().weight, cfg.observer_options);
  if (cfg.weight_bits != 0 && (cfg.weight_bits < 2 || cfg.weight_bits > 8))
    fail(ErrorKind::kInvalidArgument, "config file '" + path + "': weight_bits must be in [2, 8] (got " +
                                          std::to_string(cfg.weight_bits) + ")");
  if (cfg.block_size != 0 && cfg.block_size != 32 && cfg.block_size != 64 && cfg.block_size != 128)
    fail(ErrorKind::kInvalidArgument, "config file '" + path + "': block_size must be 32, 64 or 128 (got " +
                                          std::to_string(cfg.block_size) + ")");
  return cfg;
}

bool parse_activation_quantize_type(const std::string& type) {
  // Paddle's three values name the fake-quant op of its training-format program; in its PTQ the
  // scale comes from `algo` all the same, and once exported every activation scale is fixed: what
  // all three mean in a QDQ model, our symmetric grid.
  if (type == "range_abs_max" || type == "moving_average_abs_max" || type == "abs_max" || type == "symmetric")
    return false;
  if (type == "asymmetric") return true;
  fail(ErrorKind::kInvalidArgument, "activation_quantize_type must be range_abs_max, moving_average_abs_max, abs_max "
                                    "(Paddle's names: fixed scales from algo), symmetric or asymmetric, got '" + type + "'");
}

size_t parse_config_size(const std::string& v, const std::string& key) {
  if (!v.empty()) {
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno == 0 && end == v.c_str() + v.size() && x >= 0) return static_cast<size_t>(x);
  }
  fail(ErrorKind::kInvalidArgument, "config key '" + key + "' must be a non-negative integer, got '" + v + "'");
}

double parse_config_double(const std::string& v, const std::string& key) {
  if (!v.empty()) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str() + v.size() && std::isfinite(x)) return x;
  }
  fail(ErrorKind::kInvalidArgument, "config key '" + key + "' must be a finite number, got '" + v + "'");
}

bool parse_config_bool(const std::string& v, const std::string& key) {
  if (v == "true" || v == "True" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "False" || v == "0" || v == "no") return false;
  fail(ErrorKind::kInvalidArgument, "config key '" + key + "' must be true or false, got '" + v + "'");
}

}  // namespace slimquant::quant
