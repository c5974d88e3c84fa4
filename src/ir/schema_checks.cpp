// Checks of nodes against ONNX's operator schemas, run when a model is loaded.
//
// Attribute checks run before ONNX's shape inference sees a node. ONNX's inference functions
// divide by, index with and multiply attributes without checking them (Conv strides=[0,0] is a
// SIGFPE in onnx::convPoolShapeInference; an INTS attribute stored as FLOAT reads an empty list),
// and oneDNN does the same arithmetic again; so a file's attributes are checked here, once, against
// ONNX's own schema (types, required ones) and the ranges those functions assume.
#include <onnx/defs/schema.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::ir {
namespace {

using AttrType = onnx::AttributeProto::AttributeType;

// Larger than any window, stride, dilation or pad a real model uses, small enough that ONNX's and
// oneDNN's shape arithmetic (dim + pads, (kernel - 1) * dilation, out * stride) cannot overflow
// int64 with any dimension of a tensor within max_tensor_bytes().
constexpr int64_t kMaxWindowAttribute = int64_t{1} << 24;
// Axis attributes index a tensor's dims; ONNX narrows some to int (LayerNormalization axis=2^31
// crashes its inference). No real tensor has more dims than this.
constexpr int64_t kMaxAxisAttribute = 1024;
// Pad (opset < 11) adds its pads to dimensions; negative pads crop.
constexpr int64_t kMaxPadAttribute = int64_t{1} << 40;

AttrType type_of(const AttributeValue& v) {
  switch (v.index()) {
    case 0: return onnx::AttributeProto::INT;
    case 1: return onnx::AttributeProto::FLOAT;
    case 2: return onnx::AttributeProto::STRING;
    case 3: return onnx::AttributeProto::TENSOR;
    case 4: return onnx::AttributeProto::INTS;
    case 5: return onnx::AttributeProto::FLOATS;
    case 6: return onnx::AttributeProto::STRINGS;
    default: return onnx::AttributeProto::GRAPH;
  }
}

const char* type_name(AttrType t) {
  switch (t) {
    case onnx::AttributeProto::INT: return "INT";
    case onnx::AttributeProto::FLOAT: return "FLOAT";
    case onnx::AttributeProto::STRING: return "STRING";
    case onnx::AttributeProto::TENSOR: return "TENSOR";
    case onnx::AttributeProto::GRAPH: return "GRAPH";
    case onnx::AttributeProto::INTS: return "INTS";
    case onnx::AttributeProto::FLOATS: return "FLOATS";
    case onnx::AttributeProto::STRINGS: return "STRINGS";
    default: return "another type";
  }
}

[[noreturn]] void refuse(const Node& n, const std::string& attr, const std::string& why) {
  fail(ErrorKind::kInvalidModel, n.describe() + ": attribute '" + attr + "' " + why);
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Every value of INTS attribute `attr` (when present) lies in [lo, hi].
void check_ints_range(const Node& n, const std::string& attr, int64_t lo, int64_t hi) {
  const auto it = n.attrs.find(attr);
  if (it == n.attrs.end()) return;
  const auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  if (!v) return;  // the type check reports it
  for (int64_t x : *v)
    if (x < lo || x > hi)
      refuse(n, attr, "is " + list_str(*v) + "; each value must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
}

void check_int_range(const Node& n, const std::string& attr, int64_t lo, int64_t hi) {
  const auto it = n.attrs.find(attr);
  if (it == n.attrs.end()) return;
  const auto* v = std::get_if<int64_t>(&it->second);
  if (v && (*v < lo || *v > hi))
    refuse(n, attr, "is " + std::to_string(*v) + "; it must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// An INTS attribute's length, or -1 when it is absent or empty (ONNX then uses defaults).
int64_t ints_length(const Node& n, const std::string& attr) {
  const auto it = n.attrs.find(attr);
  if (it == n.attrs.end()) return -1;
  const auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  return v && !v->empty() ? static_cast<int64_t>(v->size()) : -1;
}

// Conv, ConvTranspose, the pools and their integer forms: windows, strides and dilations of at
// least 1, non-negative pads, one entry per spatial axis (pads: two), group >= 1.
void check_window_op(const Node& n, const Graph& g, int weight_input) {
  check_ints_range(n, "kernel_shape", 1, kMaxWindowAttribute);
  check_ints_range(n, "strides", 1, kMaxWindowAttribute);
  check_ints_range(n, "dilations", 1, kMaxWindowAttribute);
  check_ints_range(n, "pads", 0, kMaxWindowAttribute);
  check_ints_range(n, "output_padding", 0, kMaxWindowAttribute);
  check_ints_range(n, "output_shape", 0, kMaxWindowAttribute);
  check_int_range(n, "group", 1, kMaxWindowAttribute);
  // The spatial rank: the kernel's, else the weight's when it is a constant, else any list's.
  int64_t rank = ints_length(n, "kernel_shape");
  std::string rank_from = "kernel_shape";
  if (weight_input >= 0)
    if (const Tensor* w = g.initializer(n.input(static_cast<size_t>(weight_input)))) {
      // ONNX's ConvTranspose inference reads the weight's dims 2.. unchecked.
      if (w->rank() < 3)
        fail(ErrorKind::kInvalidModel, n.describe() + ": weight '" + n.input(static_cast<size_t>(weight_input)) +
                                           "' has shape " + shape_str(w->shape()) +
                                           "; it needs [out or in channels, channels, kernel...] with at least one spatial axis");
      if (rank >= 0 && rank != static_cast<int64_t>(w->rank()) - 2)
        refuse(n, "kernel_shape", "has " + std::to_string(rank) + " values for a weight of shape " + shape_str(w->shape()));
      rank = static_cast<int64_t>(w->rank()) - 2, rank_from = "the weight's rank";
    }
  for (const char* attr : {"strides", "dilations", "output_padding", "output_shape", "pads"}) {
    const int64_t length = ints_length(n, attr);
    if (length < 0) continue;
    const bool pads = std::string(attr) == "pads";
    if (pads && length % 2)
      refuse(n, attr, "has " + std::to_string(length) + " values; it needs a begin and an end per spatial axis");
    const int64_t axes = pads ? length / 2 : length;
    if (rank < 0) {
      rank = axes;
      rank_from = attr;
    } else if (axes != rank) {
      refuse(n, attr, "has " + std::to_string(length) + " values for " + std::to_string(rank) + " spatial axes (from " +
                          rank_from + ")");
    }
  }
  // ONNX's inference also indexes the data input's dims by that rank unchecked (a rank-3 input to
  // a Conv with a 2-D kernel read past its dims): a graph input of stated rank must match it.
  if (rank < 0 || n.inputs.empty()) return;
  for (const auto& in : g.inputs)
    if (in.name == n.input(0) && in.dims && static_cast<int64_t>(in.dims->size()) != rank + 2)
      fail(ErrorKind::kInvalidModel, n.describe() + ": input '" + in.name + "' has " +
                                         std::to_string(in.dims->size()) + " dims, but " + std::to_string(rank) +
                                         " spatial axes (from " + rank_from + ") need " + std::to_string(rank + 2));
}

// Range rules for the ops whose inference or kernels do arithmetic with their attributes.
void check_attribute_ranges(const Node& n, const Graph& g, int64_t opset) {
  const std::string& op = n.op_type;
  check_int_range(n, "axis", -kMaxAxisAttribute, kMaxAxisAttribute);
  check_ints_range(n, "axes", -kMaxAxisAttribute, kMaxAxisAttribute);
  if (n.domain.empty()) {
    if (op == "Conv" || op == "ConvTranspose" || op == "ConvInteger") check_window_op(n, g, 1);
    else if (op == "QLinearConv") check_window_op(n, g, 3);
    else if (op == "MaxPool" || op == "AveragePool" || op == "LpPool" || op == "MaxUnpool") check_window_op(n, g, -1);
    else if (op == "DepthToSpace" || op == "SpaceToDepth") check_int_range(n, "blocksize", 1, kMaxWindowAttribute);
    else if (op == "LRN") check_int_range(n, "size", 1, kMaxWindowAttribute);
    else if (op == "Transpose" && ints_length(n, "perm") > 0) {
      // ONNX 1.12 reads the input's dim perm[i] unchecked: perm must at least permute 0..k-1.
      std::vector<int64_t> perm = n.attr_ints("perm"), sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i)
        if (sorted[i] != static_cast<int64_t>(i)) refuse(n, "perm", "is " + list_str(perm) + ", not a permutation of 0.." + std::to_string(perm.size() - 1));
    }
    else if (op == "Split") check_ints_range(n, "split", 0, INT64_MAX);
    else if (op == "Pad" && opset < 11) {
      check_ints_range(n, "pads", -kMaxPadAttribute, kMaxPadAttribute);
      if (ints_length(n, "pads") % 2 != 0 && ints_length(n, "pads") > 0)
        refuse(n, "pads", "has an odd number of values; it needs a begin and an end per axis");
    } else if (op == "Upsample" || op == "Resize") {
      for (float s : n.attrs.count("scales") && std::holds_alternative<std::vector<float>>(n.attrs.at("scales"))
                         ? std::get<std::vector<float>>(n.attrs.at("scales"))
                         : std::vector<float>{})
        if (!std::isfinite(s) || s <= 0.f) refuse(n, "scales", "holds " + std::to_string(s) + "; scales must be finite and positive");
    } else if (op == "Clip") {
      // A NaN bound has no meaning (min(max(x, NaN), hi) is NaN or x depending on the kernel).
      for (const char* attr : {"min", "max"})
        if (const auto it = n.attrs.find(attr); it != n.attrs.end())
          if (const auto* v = std::get_if<float>(&it->second); v && std::isnan(*v)) refuse(n, attr, "is NaN");
      for (size_t i = 1; i <= 2; ++i)
        if (const Tensor* t = n.input(i).empty() ? nullptr : g.initializer(n.input(i))) {
          const std::string which = std::string(i == 1 ? "min" : "max") + " bound '" + n.input(i) + "'";
          if (t->numel() != 1)
            fail(ErrorKind::kInvalidModel, n.describe() + ": its " + which + " has shape " + shape_str(t->shape()) +
                                               "; Clip's bounds are scalars");
          if (dtype_is_float(t->dtype()) && std::isnan(t->to_float_vector()[0]))
            fail(ErrorKind::kInvalidModel, n.describe() + ": its " + which + " is NaN");
        }
    } else if (op == "Slice" && opset < 10) {
      const int64_t starts = ints_length(n, "starts"), ends = ints_length(n, "ends"), axes = ints_length(n, "axes");
      if (starts != ends || (axes >= 0 && axes != starts))
        refuse(n, "starts", "and 'ends' (and 'axes' when given) must have the same number of values");
    }
  } else if (n.domain == kSlimquantDomain && op == "QConv") {
    check_window_op(n, g, 1);
  }
}

int64_t opset_of(const Graph& g, const std::string& domain) {
  if (domain.empty()) return g.opset;
  const auto it = g.extra_opsets.find(domain);
  return it == g.extra_opsets.end() ? 1 : it->second;
}

void check_node(const Node& n, const Graph& g) {
  const int64_t opset = opset_of(g, n.domain);
  if (const onnx::OpSchema* schema =
          onnx::OpSchemaRegistry::Schema(n.op_type, static_cast<int>(opset), n.domain)) {
    for (const auto& [name, spec] : schema->attributes()) {
      const auto it = n.attrs.find(name);
      if (it == n.attrs.end()) {
        if (spec.required) refuse(n, name, "is required by " + n.op_type + " (opset " + std::to_string(opset) + ") but missing");
        continue;
      }
      const AttrType have = type_of(it->second);
      // An INT where a FLOAT is expected is read as that number (Node::attr_float) and harmless.
      const bool int_as_float = spec.type == onnx::AttributeProto::FLOAT && have == onnx::AttributeProto::INT;
      if (have != spec.type && !int_as_float && spec.type != onnx::AttributeProto::UNDEFINED)
        refuse(n, name, std::string("is ") + type_name(have) + ", " + n.op_type + " expects " + type_name(spec.type));
    }
  }
  check_attribute_ranges(n, g, opset);
}

// ONNX's name for a dtype inside "tensor(...)".
std::string onnx_type_string(DType t) {
  switch (t) {
    case DType::kFloat32: return "tensor(float)";
    case DType::kFloat64: return "tensor(double)";
    default: return std::string("tensor(") + dtype_name(t) + ")";
  }
}

// The dtype of `v` when the file states it: an initializer's, or a graph input's declared one.
DType stated_dtype(const Graph& g, const std::string& v) {
  if (const Tensor* t = g.initializer(v)) return t->dtype();
  for (const auto& in : g.inputs)
    if (in.name == v) return in.dtype;
  return DType::kUndefined;
}

// Input and output counts from the schema; the dtypes the file states against the type constraints.
void check_inputs_against_schema(const Node& n, const Graph& g) {
  if (!n.domain.empty()) return;
  const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type, static_cast<int>(g.opset), "");
  if (!schema) return;
  // Arity: kernels and fusion passes index inputs by position (a BatchNormalization turned Clip
  // kept five inputs and handed a weight vector to oneDNN as a bound).
  const int inputs = static_cast<int>(n.declared_inputs()), outputs = static_cast<int>(n.outputs.size());
  // In an opset newer than the library knows, its schema is the op's older version: newer ones only
  // added optional inputs (Reduce's axes), and the loader refused the nodes that use what it lacks.
  const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const auto onnx_range = known.find("");
  const bool newer_than_library = onnx_range != known.end() && g.opset > onnx_range->second.second;
  if (inputs < schema->min_input() || (inputs > schema->max_input() && !newer_than_library))
    fail(ErrorKind::kInvalidModel, n.describe() + " has " + std::to_string(inputs) + " inputs; " + n.op_type +
                                       " (opset " + std::to_string(g.opset) + ") takes " +
                                       std::to_string(schema->min_input()) + " to " + std::to_string(schema->max_input()));
  if (outputs < schema->min_output() || outputs > schema->max_output())
    fail(ErrorKind::kInvalidModel, n.describe() + " has " + std::to_string(outputs) + " outputs; " + n.op_type +
                                       " (opset " + std::to_string(g.opset) + ") gives " +
                                       std::to_string(schema->min_output()) + " to " + std::to_string(schema->max_output()));
  if (schema->inputs().empty()) return;
  const auto& formals = schema->inputs();
  std::map<std::string, std::pair<DType, size_t>> bound;  // type parameter -> (dtype, first input)
  for (size_t i = 0; i < n.declared_inputs(); ++i) {
    if (i >= formals.size() && formals.back().GetOption() != onnx::OpSchema::Variadic) break;
    const auto& formal = formals[std::min(i, formals.size() - 1)];
    if (n.inputs[i].empty() && formal.GetOption() != onnx::OpSchema::Optional)
      fail(ErrorKind::kInvalidModel, n.describe() + ": input " + std::to_string(i) + " (" + formal.GetName() +
                                         ") is required but the node leaves it empty");
    const DType dtype = n.inputs[i].empty() ? DType::kUndefined : stated_dtype(g, n.inputs[i]);
    // Optional and sequence values: their ValueInfo states the element type, not the ONNX type.
    if (dtype == DType::kUndefined || g.optional_values.count(n.inputs[i]) || g.sequence_values.count(n.inputs[i]))
      continue;
    const std::string type = onnx_type_string(dtype);
    const auto& allowed = formal.GetTypes();
    if (!allowed.empty() &&
        std::none_of(allowed.begin(), allowed.end(), [&](const std::string* a) { return a && *a == type; })) {
      std::set<std::string> names;
      for (const std::string* a : allowed) names.insert(*a);
      std::string list;
      for (const auto& a : names) list += (list.empty() ? "" : ", ") + a;
      fail(ErrorKind::kInvalidModel, n.describe() + ": input " + std::to_string(i) + " (" + formal.GetName() + ", '" +
                                         n.inputs[i] + "') is " + dtype_name(dtype) + "; " + n.op_type +
                                         " takes " + list + " there");
    }
    if (!formal.GetIsHomogeneous() && formal.GetOption() == onnx::OpSchema::Variadic) continue;
    const auto [it, first] = bound.emplace(formal.GetTypeStr(), std::make_pair(dtype, i));
    const auto& params = schema->typeConstraintParams();
    const bool type_parameter = std::any_of(params.begin(), params.end(), [&](const auto& p) {
      return p.type_param_str == formal.GetTypeStr();
    });
    if (!first && it->second.first != dtype && type_parameter)
      fail(ErrorKind::kInvalidModel, n.describe() + ": input " + std::to_string(i) + " ('" + n.inputs[i] + "') is " +
                                         dtype_name(dtype) + " but input " + std::to_string(it->second.second) +
                                         " of the same type " + formal.GetTypeStr() + " is " +
                                         dtype_name(it->second.first));
  }
}

}  // namespace

void check_constant_input_types(const Graph& graph) {
  for (const Node& n : graph.nodes) {
    check_inputs_against_schema(n, graph);
    for (const auto& [key, value] : n.attrs)
      if (const auto* branch = std::get_if<std::shared_ptr<const Graph>>(&value)) check_constant_input_types(**branch);
  }
}

void check_node_attributes(const Graph& graph) {
  for (const Node& n : graph.nodes) {
    check_node(n, graph);
    for (const auto& [key, value] : n.attrs)
      if (const auto* branch = std::get_if<std::shared_ptr<const Graph>>(&value)) check_node_attributes(**branch);
  }
}

}  // namespace slimquant::ir
