// The proof behind analyze_sample_independence (slimquant/runtime/session.h).
#include "slimquant/runtime/session.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace slimquant::runtime {
namespace {

// One element of a small integer vector (a shape, a Reshape target, an index): a known value, a
// known multiple of the batch size N (what Shape reads at the batch axis; attention exports
// compute N * heads and tokens * N), a value that does not change with N but is not known here
// (another axis's size), or one that depends on N some other way.
struct Elem {
  enum Kind : uint8_t { kValue, kBatch, kInvariant, kDependent } kind = kDependent;
  int64_t value = 0;  // kValue: the value; kBatch: the multiple of N (>= 1)
  static Elem of(int64_t v) { return {kValue, v}; }
  static Elem batch(int64_t multiple) { return {kBatch, multiple}; }
  static Elem unknown() { return {kInvariant, 0}; }
  bool invariant() const { return kind == kValue || kind == kInvariant; }
  bool is(int64_t v) const { return kind == kValue && value == v; }
  bool is_n() const { return kind == kBatch && value == 1; }
};

// What the analysis knows of a value.
struct Fact {
  enum Kind : uint8_t {
    kStatic,   // does not depend on the samples' data (it may depend on the batch size: see elems)
    kBatched,  // along `axis` (outer * N * inner entries), entry j depends on sample (j / inner) % N alone
    kMixed,    // anything else
  } kind = kMixed;
  size_t axis = 0;                          // kBatched
  // kBatched: how the batch shares its axis. 1 and 1 for a plain batch axis; inner = heads after an
  // attention export's [L, N, D] -> [L, N * heads, D / heads]; outer = L after [L, N, D] -> [L * N, D].
  int64_t outer = 1, inner = 1;
  std::optional<size_t> rank;               // kBatched, kStatic: when known
  std::optional<std::vector<Elem>> dims;    // kBatched: its sizes where followed (kBatch at `axis`)
  std::optional<Shape> shape;               // kStatic: when known
  std::optional<std::vector<Elem>> elems;   // kStatic, rank <= 1: its elements, when known
  std::optional<Tensor> small;              // kStatic: a small constant's value (Resize's scales)
  bool batch_invariant = true;              // kStatic: the same for any batch size
  std::string reason;                       // kMixed

  static Fact mixed(std::string why) {
    Fact f;
    f.reason = std::move(why);
    return f;
  }
  static Fact batched(size_t axis, std::optional<size_t> rank) {
    Fact f;
    f.kind = kBatched;
    f.axis = axis;
    f.rank = rank;
    return f;
  }
  // This batch moved to another axis (or rank): the same sharing of its axis, sizes not followed.
  Fact moved(size_t to_axis, std::optional<size_t> to_rank) const {
    Fact f = batched(to_axis, to_rank);
    f.outer = outer;
    f.inner = inner;
    return f;
  }
  // The same batch with these sizes (dropped unless they match the rank and hold the batch at axis).
  Fact sized(std::optional<std::vector<Elem>> d) const {
    Fact f = *this;
    f.dims.reset();
    if (!d || !rank || d->size() != *rank || axis >= d->size() || (*d)[axis].kind != Elem::kBatch ||
        (*d)[axis].value != outer * inner)
      return f;
    for (size_t i = 0; i < d->size(); ++i)
      if (i != axis && !(*d)[i].invariant()) return f;
    f.dims = std::move(d);
    return f;
  }
  bool shares_batch_with(const Fact& o) const { return outer == o.outer && inner == o.inner; }
  // Its size along axis i as an element: the batch's multiple at the batch axis, else what is known.
  Elem dim(size_t i) const {
    if (dims && i < dims->size()) return (*dims)[i];
    if (kind == kBatched && i == axis) return Elem::batch(outer * inner);
    if (kind == kStatic && shape && i < shape->size()) return Elem::of((*shape)[i]);
    return Elem::unknown();
  }
  static Fact of_tensor(const Tensor& t) {
    Fact f;
    f.kind = kStatic;
    f.shape = t.shape();
    f.rank = t.rank();
    if (t.numel() <= 64) f.small = t;
    const bool integral = t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32 || t.dtype() == DType::kBool;
    if (integral && t.rank() <= 1 && t.numel() <= 64) {
      f.elems.emplace();
      for (int64_t v : t.to_int64_vector()) f.elems->push_back(Elem::of(v));
    }
    return f;
  }
  // A static vector of these elements (rank 1, or 0 when scalar).
  static Fact of_elems(std::vector<Elem> e, bool scalar) {
    Fact f;
    f.kind = kStatic;
    f.rank = scalar ? 0 : 1;
    f.shape = scalar ? Shape{} : Shape{static_cast<int64_t>(e.size())};
    f.batch_invariant = std::all_of(e.begin(), e.end(), [](const Elem& x) { return x.invariant(); });
    f.elems = std::move(e);
    return f;
  }
  // A static matrix of these elements in row-major order (PyTorch's F.pad writes its pads as one:
  // Reshape to [-1, 2], Slice backwards, Transpose, Reshape to [-1]).
  static Fact of_elems_shaped(std::vector<Elem> e, Shape shape) {
    Fact f = of_elems(std::move(e), false);
    f.rank = shape.size();
    f.shape = std::move(shape);
    return f;
  }
  bool is_static() const { return kind == kStatic; }
  bool is_batched() const { return kind == kBatched; }
  // A static value usable as data next to batched values: the same in every part.
  bool invariant_static() const { return kind == kStatic && batch_invariant; }
  // Its known integer values (all kValue).
  std::optional<std::vector<int64_t>> values() const {
    if (!elems) return std::nullopt;
    std::vector<int64_t> v;
    for (const Elem& e : *elems) {
      if (e.kind != Elem::kValue) return std::nullopt;
      v.push_back(e.value);
    }
    return v;
  }
};

std::optional<size_t> normalized(int64_t axis, std::optional<size_t> rank) {
  if (!rank) return axis >= 0 ? std::optional<size_t>(static_cast<size_t>(axis)) : std::nullopt;
  const auto r = static_cast<int64_t>(*rank);
  if (axis < -r || axis >= r) return std::nullopt;
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

// a * b, or nullopt where it overflows (sizes from a malformed model).
std::optional<int64_t> times(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

bool is_one_of(const std::string& op, std::initializer_list<const char*> ops) {
  return std::any_of(ops.begin(), ops.end(), [&](const char* o) { return op == o; });
}

// Ops that map each element (or each position, for their extra outputs) on its own.
bool elementwise_unary(const std::string& op) {
  return is_one_of(op, {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Erf", "Reciprocal",
                        "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf", "Sin", "Cos", "Tan", "Asin",
                        "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softplus", "Softsign",
                        "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Gelu", "Mish",
                        "ThresholdedRelu", "Identity", "Cast", "Shrink", "BitwiseNot"});
}

bool broadcasting(const std::string& op) {
  return is_one_of(op, {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater",
                        "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu", "BitShift", "Where",
                        "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Clip", "QuantizeLinear",
                        "DequantizeLinear"});
}

// Ops defined over [N, C, spatial...] whose other inputs are parameters.
bool per_image(const std::string& op) {
  return is_one_of(op, {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
                        "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "LRN", "InstanceNormalization",
                        "BatchNormalization", "DepthToSpace", "SpaceToDepth", "GroupNormalization"});
}

bool reduction(const std::string& op) {
  return is_one_of(op, {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"});
}

class Analysis {
 public:
  Analysis(const ir::Graph& g, const BatchAxes& input_axes) : g_(g) {
    for (const auto& [name, t] : g.initializers) facts_[name] = Fact::of_tensor(t);
    for (const auto& in : g.inputs) {
      std::optional<size_t> rank;
      if (in.dims) rank = in.dims->size();
      if (rank == size_t{0}) {
        Fact f;  // a scalar input: fed whole to every part
        f.kind = Fact::kStatic;
        f.rank = 0;
        f.shape = Shape{};
        facts_[in.name] = f;
        continue;
      }
      if (g.sequence_values.count(in.name) || g.optional_values.count(in.name)) {
        facts_[in.name] = Fact::mixed("input '" + in.name + "' is a sequence or optional");
        continue;
      }
      const size_t axis = batch_axis_of(input_axes, in.name);
      std::optional<std::vector<Elem>> dims;
      if (in.dims) {
        dims.emplace();
        for (size_t i = 0; i < in.dims->size(); ++i) {
          const ir::Dim& d = (*in.dims)[i];
          dims->push_back(i == axis ? Elem::batch(1) : d.known() ? Elem::of(d.value) : Elem::unknown());
        }
      }
      facts_[in.name] = Fact::batched(axis, rank).sized(dims);
    }
  }

  SampleIndependence run() {
    SampleIndependence result;
    for (const auto& node : g_.nodes) {
      std::vector<Fact> out = visit(node);
      out.resize(node.outputs.size(), out.empty() ? Fact::mixed("") : out.back());
      for (size_t k = 0; k < node.outputs.size(); ++k) {
        if (node.outputs[k].empty()) continue;
        if (out[k].kind == Fact::kMixed && out[k].reason.empty()) out[k].reason = "mixes samples";
        facts_[node.outputs[k]] = out[k];
      }
    }
    for (const auto& o : g_.outputs) {
      const Fact& f = fact(o.name);
      if (f.is_batched() && (f.outer != 1 || f.inner != 1)) {
        result.reason = "output '" + o.name + "' holds its samples merged with another axis";
        return result;
      }
      if (f.is_batched()) {
        if (f.axis != 0) result.output_axes[o.name] = f.axis;
        continue;
      }
      result.reason = "output '" + o.name + "': " +
                      (f.kind == Fact::kMixed ? f.reason : std::string("has no batch axis (the same for every sample)"));
      return result;
    }
    result.independent = true;
    return result;
  }

  // The element type of v where the graph declares it or the op producing it fixes it (shape
  // arithmetic: Shape's int64, then ops keeping their data input's type); kUndefined otherwise.
  // producers: each value's node (Graph::producer scans the graph on every call).
  DType integer_type(const std::string& v, const std::unordered_map<std::string, size_t>& producers) const {
    if (const Tensor* t = g_.initializer(v)) return t->dtype();
    if (const ir::ValueInfo* info = g_.find_value_info(v); info && info->dtype != DType::kUndefined) return info->dtype;
    const auto p = producers.find(v);
    if (p == producers.end()) return DType::kUndefined;
    const ir::Node& n = g_.nodes[p->second];
    if (!n.domain.empty() && n.domain != "ai.onnx") return DType::kUndefined;
    if (is_one_of(n.op_type, {"Shape", "Size"})) return DType::kInt64;
    if (n.op_type == "Cast") return dtype_from_onnx(static_cast<int>(n.attr_int("to", 0)));
    if (n.op_type == "Where") return n.input(1).empty() ? DType::kUndefined : integer_type(n.input(1), producers);
    if (is_one_of(n.op_type, {"Gather", "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Min", "Max", "Unsqueeze",
                              "Squeeze", "Concat", "Slice", "Reshape", "Expand", "Identity", "Transpose", "Range",
                              "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "Tile", "Flatten"}) &&
        !n.input(0).empty())
      return integer_type(n.input(0), producers);
    return DType::kUndefined;
  }

  // After run(): the values nodes compute that the proof knows element by element and that are
  // the same for any batch size (shape arithmetic on fixed sizes), as int64 / int32 tensors of
  // their declared type.
  std::map<std::string, Tensor> known_static_values() const {
    std::map<std::string, Tensor> known;
    std::unordered_map<std::string, size_t> producers;
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (const std::string& v : g_.nodes[i].outputs) producers.emplace(v, i);
    for (const auto& node : g_.nodes)
      for (const std::string& v : node.outputs) {
        const auto it = facts_.find(v);
        if (v.empty() || it == facts_.end() || !it->second.invariant_static() || !it->second.shape) continue;
        const std::optional<std::vector<int64_t>> values = it->second.values();
        const Shape& shape = *it->second.shape;
        if (!values || shape.size() > 2 || shape_numel(shape) != static_cast<int64_t>(values->size())) continue;
        const DType type = integer_type(v, producers);
        if (type != DType::kInt64 && type != DType::kInt32) continue;
        const bool fits = type == DType::kInt64 || std::all_of(values->begin(), values->end(), [](int64_t x) {
          return x == static_cast<int32_t>(x);
        });
        if (!fits) continue;
        Tensor t(type, shape);
        for (size_t i = 0; i < values->size(); ++i) {
          if (type == DType::kInt64)
            t.data<int64_t>()[i] = (*values)[i];
          else
            t.data<int32_t>()[i] = static_cast<int32_t>((*values)[i]);
        }
        known.emplace(v, std::move(t));
      }
    return known;
  }

 private:
  const Fact& fact(const std::string& name) {
    static const Fact absent = Fact::mixed("a value the analysis did not see");
    const auto it = facts_.find(name);
    return it == facts_.end() ? absent : it->second;
  }
  const Fact* input(const ir::Node& n, size_t i) { return n.input(i).empty() ? nullptr : &fact(n.input(i)); }

  static Fact mixed(const ir::Node& n, const std::string& why) { return Fact::mixed(n.describe() + " " + why); }

  // The first non-static input's failure, or nullopt when the inputs are all static or batched.
  std::optional<Fact> first_mixed(const ir::Node& n) {
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (!n.inputs[i].empty() && fact(n.inputs[i]).kind == Fact::kMixed) return fact(n.inputs[i]);
    return std::nullopt;
  }

  std::vector<Fact> visit(const ir::Node& n) {
    if (!n.domain.empty() && n.domain != "ai.onnx") return {mixed(n, "is not an ONNX op the analysis knows")};
    // Each part would draw its own numbers.
    if (is_one_of(n.op_type, {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                              "Multinomial"}))
      return {mixed(n, "draws random numbers")};
    if (n.op_type == "Constant") return {constant(n)};
    if (n.op_type == "DynamicQuantizeLinear") return {mixed(n, "takes one scale over the whole batch")};
    if (auto m = first_mixed(n)) return {*m};
    bool all_static = true;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (!n.inputs[i].empty()) all_static = all_static && fact(n.inputs[i]).is_static();
    if (n.op_type == "Shape") return {shape_of(n)};
    if (n.op_type == "Size") {
      const bool invariant = input(n, 0) && input(n, 0)->invariant_static();
      return {Fact::of_elems({invariant ? Elem{Elem::kInvariant, 0} : Elem{}}, true)};
    }
    if (all_static) return {static_result(n)};
    if (!input(n, 0)) return {mixed(n, "reads batched values without a first input")};
    if (n.op_type == "CastLike") return same_for_each_output(n, *input(n, 0));
    if (elementwise_unary(n.op_type) || n.op_type == "Dropout") return same_for_each_output(n, *input(n, 0));
    if (broadcasting(n.op_type)) return {broadcast(n)};
    if (per_image(n.op_type)) return per_image_op(n);
    if (reduction(n.op_type)) return {reduce(n)};
    if (n.op_type == "MatMul" || n.op_type == "MatMulInteger") return {matmul(n, 0, 1)};
    if (n.op_type == "QLinearMatMul") return {matmul(n, 0, 3)};
    if (n.op_type == "Gemm") return {gemm(n)};
    if (n.op_type == "Flatten") return {flatten(n)};
    if (n.op_type == "Reshape") return {reshape(n)};
    if (n.op_type == "Transpose") return {transpose(n)};
    if (n.op_type == "Squeeze") return {squeeze(n)};
    if (n.op_type == "Unsqueeze") return {unsqueeze(n)};
    if (n.op_type == "Concat") return {concat(n)};
    if (n.op_type == "Split") return split(n);
    if (n.op_type == "Slice") return {slice(n)};
    if (n.op_type == "Gather") return {gather(n)};
    if (n.op_type == "Expand") return {expand(n)};
    if (n.op_type == "Resize" || n.op_type == "Upsample") return {resize(n)};
    if (is_one_of(n.op_type, {"Softmax", "LogSoftmax", "Hardmax"})) return {softmax(n)};
    if (n.op_type == "LayerNormalization") return layer_norm(n);
    if (n.op_type == "Pad") return {pad(n)};
    if (n.op_type == "Tile") return {tile(n)};
    if (n.op_type == "TopK" || n.op_type == "CumSum") return along_one_axis(n);
    if (is_one_of(n.op_type, {"LSTM", "GRU", "RNN"})) return recurrent(n);
    return {mixed(n, "is an op the sample-independence analysis does not know")};
  }

  Fact constant(const ir::Node& n) {
    if (const Tensor* t = n.attr_tensor("value")) return Fact::of_tensor(*t);
    if (n.has_attr("value_int")) return Fact::of_tensor(Tensor::scalar<int64_t>(n.attr_int("value_int", 0)));
    if (n.has_attr("value_ints")) {
      const auto v = n.attr_ints("value_ints");
      return Fact::of_tensor(Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
    }
    Fact f;
    f.kind = Fact::kStatic;
    return f;
  }

  // Shape(x): N at x's batch axis, the other sizes invariant (known for a static x of known shape).
  Fact shape_of(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    std::vector<Elem> e;
    if (x.is_static() && x.shape) {
      for (int64_t d : *x.shape) e.push_back(Elem::of(d));
    } else if (x.rank) {
      for (size_t i = 0; i < *x.rank; ++i) e.push_back(x.dim(i));
      if (x.is_static() && !x.batch_invariant) std::fill(e.begin(), e.end(), Elem{});
    } else {
      Fact f;
      f.kind = Fact::kStatic;
      f.rank = 1;
      f.batch_invariant = x.is_static() && x.batch_invariant;
      return f;
    }
    const auto r = static_cast<int64_t>(e.size());
    int64_t start = n.attr_int("start", 0), end = n.attr_int("end", r);
    start = std::clamp(start < 0 ? start + r : start, int64_t{0}, r);
    end = std::clamp(end < 0 ? end + r : end, int64_t{0}, r);
    return Fact::of_elems(std::vector<Elem>(e.begin() + start, e.begin() + std::max(start, end)), false);
  }

  // Every input static: shape arithmetic (elements followed where the op is simple), or a value
  // computed from constants.
  Fact static_result(const ir::Node& n) {
    bool invariant = true;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (!n.inputs[i].empty()) invariant = invariant && fact(n.inputs[i]).batch_invariant;
    Fact f;
    f.kind = Fact::kStatic;
    f.batch_invariant = invariant;
    if (!input(n, 0)) return f;  // no first input (SequenceEmpty, Optional)
    // Expand to a shape holding N (ViT's class token, expanded to [N, 1, 768]): one copy per sample.
    if (n.op_type == "Expand" && input(n, 1) && !input(n, 1)->batch_invariant) return expand(n);
    if (auto shape_fact = shape_arithmetic(n)) return *shape_fact;
    // Same shape as the first input: keep it (a DequantizeLinear of int8 weights, a Cast).
    if ((elementwise_unary(n.op_type) || is_one_of(n.op_type, {"DequantizeLinear", "QuantizeLinear"})) &&
        input(n, 0)->shape) {
      f.shape = input(n, 0)->shape;
      f.rank = f.shape->size();
    }
    if (broadcasting(n.op_type) && !is_one_of(n.op_type, {"QuantizeLinear", "DequantizeLinear"})) {
      // Pow(head_dim, -0.5) and the like: the broadcast of known shapes.
      Shape out;
      bool known = true;
      for (size_t i = 0; i < n.inputs.size() && known; ++i) {
        const Fact* in = input(n, i);
        if (!in) continue;
        known = in->shape.has_value();
        if (!known) break;
        const Shape& s = *in->shape;
        if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
        for (size_t k = 0; k < s.size(); ++k) {
          int64_t& o = out[out.size() - s.size() + k];
          if (o == 1) o = s[k];
          else if (s[k] != 1 && s[k] != o) known = false;
        }
      }
      if (known) {
        f.shape = out;
        f.rank = out.size();
      }
    }
    if (n.op_type == "Transpose" && input(n, 0)->shape) {
      const Shape& s = *input(n, 0)->shape;
      std::vector<int64_t> perm = n.attr_ints("perm");
      if (perm.empty())
        for (size_t i = s.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
      if (perm.size() == s.size()) {
        Shape t;
        for (int64_t p : perm) t.push_back(s.at(static_cast<size_t>(p)));
        f.shape = t;
        f.rank = t.size();
      }
    }
    if (!f.batch_invariant) f.elems.reset();
    return f;
  }

  static Elem arithmetic(const std::string& op, const Elem& a, const Elem& b) {
    if (a.kind == Elem::kValue && b.kind == Elem::kValue) {
      if (op == "Add") return Elem::of(a.value + b.value);
      if (op == "Sub") return Elem::of(a.value - b.value);
      if (op == "Mul") return times(a.value, b.value) ? Elem::of(*times(a.value, b.value)) : Elem{};
      if (op == "Div") return b.value == 0 ? Elem{} : Elem::of(a.value / b.value);
      if (op == "Mod") {  // integer Mod (fmod 0): the remainder takes the divisor's sign
        if (b.value == 0) return Elem{};
        const int64_t r = a.value % b.value;
        return Elem::of(r != 0 && (r < 0) != (b.value < 0) ? r + b.value : r);
      }
      if (op == "Equal") return Elem::of(a.value == b.value);
      return Elem{};
    }
    if (op == "Equal") {
      if (a.kind == Elem::kBatch && b.kind == Elem::kBatch) return Elem::of(a.value == b.value);
      // N >= 1: never equal to a value below 1 (ViT's Where(Equal(shape, -1), 1, shape) for Expand).
      if (a.kind == Elem::kBatch && b.kind == Elem::kValue && b.value < 1) return Elem::of(0);
      if (b.kind == Elem::kBatch && a.kind == Elem::kValue && a.value < 1) return Elem::of(0);
    }
    // Multiples of N: N * heads (torchvision's attention), tokens * N, and back by exact division.
    const bool batch_times_value = (a.kind == Elem::kBatch && b.kind == Elem::kValue && b.value >= 1) ||
                                   (b.kind == Elem::kBatch && a.kind == Elem::kValue && a.value >= 1);
    if (op == "Mul" && batch_times_value) return times(a.value, b.value) ? Elem::batch(*times(a.value, b.value)) : Elem{};
    if (op == "Div" && a.kind == Elem::kBatch && b.kind == Elem::kValue && b.value >= 1 && a.value % b.value == 0)
      return Elem::batch(a.value / b.value);
    const bool keeps_a = (op == "Mul" || op == "Div") ? b.kind == Elem::kValue && b.value == 1
                         : (op == "Add" || op == "Sub") && b.kind == Elem::kValue && b.value == 0;
    if (a.kind == Elem::kBatch && keeps_a) return a;
    if (b.kind == Elem::kBatch && op == "Mul" && a.kind == Elem::kValue && a.value == 1) return b;
    if (b.kind == Elem::kBatch && op == "Add" && a.kind == Elem::kValue && a.value == 0) return b;
    if (a.invariant() && b.invariant()) return Elem{Elem::kInvariant, 0};
    return Elem{};
  }

  // Shape, Gather, Slice, Concat, ... over small vectors, followed element by element.
  std::optional<Fact> shape_arithmetic(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.elems) return std::nullopt;
    const std::vector<Elem>& e = *x.elems;
    const bool scalar = x.rank == size_t{0};
    const bool matrix = x.rank == size_t{2} && x.shape && x.shape->size() == 2;
    if (x.rank > size_t{2} || (x.rank == size_t{2} && !matrix)) return std::nullopt;
    auto shaped_like_x = [&](std::vector<Elem> v) {
      return matrix ? Fact::of_elems_shaped(std::move(v), *x.shape) : Fact::of_elems(std::move(v), scalar);
    };
    if (n.op_type == "Identity") return shaped_like_x(e);
    if (n.op_type == "Cast") {
      // Values are followed as integers: cast to another type they are only known not to depend on N.
      const auto to = static_cast<DType>(n.attr_int("to", 0));
      if (to == DType::kInt64 || to == DType::kInt32) return shaped_like_x(e);
      std::vector<Elem> kept = e;
      for (Elem& x : kept)
        if (x.kind == Elem::kValue) x = Elem{Elem::kInvariant, 0};
      return shaped_like_x(kept);
    }
    if (n.op_type == "Reshape" && n.inputs.size() > 1) return reshape_elems(n, x);
    if (n.op_type == "Slice" && !scalar) return slice_elems(n, x);
    if (n.op_type == "Transpose" && matrix) {
      const std::vector<int64_t> perm = n.attr_ints("perm", {1, 0});
      if (perm == std::vector<int64_t>{0, 1}) return shaped_like_x(e);
      if (perm != std::vector<int64_t>{1, 0}) return std::nullopt;
      const int64_t rows = (*x.shape)[0], cols = (*x.shape)[1];
      std::vector<Elem> t;
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r) t.push_back(e[static_cast<size_t>(r * cols + c)]);
      return Fact::of_elems_shaped(std::move(t), {cols, rows});
    }
    if (matrix) return std::nullopt;  // the rest follow vectors only
    if (n.op_type == "Unsqueeze" && scalar) return Fact::of_elems(e, false);
    if (n.op_type == "Squeeze" && !scalar && e.size() == 1) return Fact::of_elems(e, true);
    if (n.op_type == "Gather" && n.inputs.size() > 1 && n.attr_int("axis", 0) == 0 && !scalar) {
      const Fact& idx = *input(n, 1);
      const auto at = idx.values();
      if (!at) return std::nullopt;
      std::vector<Elem> picked;
      for (int64_t i : *at) {
        const int64_t k = i < 0 ? i + static_cast<int64_t>(e.size()) : i;
        if (k < 0 || k >= static_cast<int64_t>(e.size())) return std::nullopt;
        picked.push_back(e[static_cast<size_t>(k)]);
      }
      return Fact::of_elems(picked, idx.rank == size_t{0});
    }
    if (n.op_type == "Concat") {
      std::vector<Elem> joined;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const Fact* f = input(n, i);
        if (!f) continue;
        if (!f->elems || f->rank != size_t{1}) return std::nullopt;
        joined.insert(joined.end(), f->elems->begin(), f->elems->end());
      }
      return Fact::of_elems(joined, false);
    }
    if (n.op_type == "ConstantOfShape") {
      // A tensor of the shape these elements give: static when they do not involve N, else
      // batched along the one axis of size N (every sample's slice the same constant).
      std::optional<size_t> batch_at;
      for (size_t i = 0; i < e.size(); ++i) {
        if (e[i].is_n() && !batch_at) batch_at = i;
        else if (!e[i].invariant()) return Fact::mixed(n.describe() + " takes a shape that depends on the batch size");
      }
      if (batch_at) return Fact::batched(*batch_at, e.size()).sized(e);
      Fact f;
      f.kind = Fact::kStatic;
      f.rank = e.size();
      if (const auto v = x.values()) {
        f.shape = Shape(v->begin(), v->end());
        const Tensor* fill = n.attr_tensor("value");
        if (v->size() == 1 && v->at(0) <= 64) {
          const int64_t value = fill ? fill->to_int64_vector().at(0) : 0;
          f.elems = std::vector<Elem>(static_cast<size_t>(v->at(0)), Elem::of(value));
        }
      }
      return f;
    }
    if (is_one_of(n.op_type, {"Add", "Sub", "Mul", "Div", "Mod", "Equal", "Where"})) {
      std::vector<const std::vector<Elem>*> args;
      std::vector<bool> scalars;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const Fact* f = input(n, i);
        if (!f || !f->elems || f->rank > size_t{1}) return std::nullopt;
        args.push_back(&*f->elems);
        scalars.push_back(f->rank == size_t{0});
      }
      size_t len = 1;
      for (const auto* a : args)
        if (a->size() != 1) {
          if (len != 1 && len != a->size()) return std::nullopt;
          len = a->size();
        }
      const bool all_scalar = std::all_of(scalars.begin(), scalars.end(), [](bool s) { return s; });
      std::vector<Elem> r;
      for (size_t k = 0; k < len; ++k) {
        auto at = [&](size_t i) { return (*args[i])[args[i]->size() == 1 ? 0 : k]; };
        if (n.op_type == "Where") {
          const Elem c = at(0);
          if (c.kind == Elem::kValue) r.push_back(c.value ? at(1) : at(2));
          else r.push_back(c.invariant() && at(1).invariant() && at(2).invariant() ? Elem{Elem::kInvariant, 0} : Elem{});
        } else {
          r.push_back(arithmetic(n.op_type, at(0), at(1)));
        }
      }
      return Fact::of_elems(r, all_scalar);
    }
    return std::nullopt;
  }

  // Slice's bounds: from attributes (opset < 10) or static inputs; axes as values (empty: the
  // first starts.size() axes), steps empty for all 1. nullopt where they are not known here.
  struct SliceBounds {
    std::vector<Elem> starts, ends, steps;
    std::vector<int64_t> axes;
  };
  std::optional<SliceBounds> slice_bounds(const ir::Node& n) {
    SliceBounds b;
    if (g_.opset < 10) {
      for (int64_t v : n.attr_ints("starts")) b.starts.push_back(Elem::of(v));
      for (int64_t v : n.attr_ints("ends")) b.ends.push_back(Elem::of(v));
      b.axes = n.attr_ints("axes");
    } else {
      auto elems_of = [&](size_t i) -> const std::vector<Elem>* {
        const Fact* f = input(n, i);
        return f && f->is_static() && f->elems ? &*f->elems : nullptr;
      };
      if (!elems_of(1) || !elems_of(2) || (input(n, 4) && !elems_of(4))) return std::nullopt;
      b.starts = *elems_of(1), b.ends = *elems_of(2);
      if (input(n, 4)) b.steps = *elems_of(4);
      if (input(n, 3)) {
        const auto axes = input(n, 3)->values();
        if (!axes) return std::nullopt;
        b.axes = *axes;
      }
    }
    if (b.starts.size() != b.ends.size() || (!b.axes.empty() && b.axes.size() != b.starts.size()) ||
        (!b.steps.empty() && b.steps.size() != b.starts.size()))
      return std::nullopt;
    return b;
  }

  // Slice of a small vector or matrix with known bounds (any steps), element by element.
  std::optional<Fact> slice_elems(const ir::Node& n, const Fact& x) {
    const auto b = slice_bounds(n);
    if (!b || !x.shape || x.shape->empty()) return std::nullopt;
    const Shape& shape = *x.shape;
    std::vector<std::vector<int64_t>> kept(shape.size());  // the indices kept along each axis
    for (size_t a = 0; a < shape.size(); ++a)
      for (int64_t i = 0; i < shape[a]; ++i) kept[a].push_back(i);
    for (size_t i = 0; i < b->starts.size(); ++i) {
      const auto axis = b->axes.empty() ? std::optional<size_t>(i) : normalized(b->axes[i], shape.size());
      const Elem step = b->steps.empty() ? Elem::of(1) : b->steps[i];
      if (!axis || b->starts[i].kind != Elem::kValue || b->ends[i].kind != Elem::kValue ||
          step.kind != Elem::kValue || step.value == 0)
        return std::nullopt;
      kept[*axis] = slice_indices(shape[*axis], b->starts[i].value, b->ends[i].value, step.value);
    }
    std::vector<Elem> picked;
    Shape out;
    for (const auto& k : kept) out.push_back(static_cast<int64_t>(k.size()));
    if (shape.size() == 1) {
      for (int64_t i : kept[0]) picked.push_back((*x.elems)[static_cast<size_t>(i)]);
      return Fact::of_elems(std::move(picked), false);
    }
    for (int64_t r : kept[0])
      for (int64_t c : kept[1]) picked.push_back((*x.elems)[static_cast<size_t>(r * shape[1] + c)]);
    return Fact::of_elems_shaped(std::move(picked), out);
  }

  // Reshape of a small vector or matrix to known sizes (0 copies, one -1 inferred), up to rank 2.
  std::optional<Fact> reshape_elems(const ir::Node& n, const Fact& x) {
    const auto target = input(n, 1)->values();
    if (!target || !x.shape) return std::nullopt;
    const auto count = static_cast<int64_t>(x.elems->size());
    Shape out;
    int64_t known = 1;
    std::optional<size_t> inferred;
    for (size_t i = 0; i < target->size(); ++i) {
      int64_t v = (*target)[i];
      if (v == 0 && n.attr_int("allowzero", 0) == 0) {
        if (i >= x.shape->size()) return std::nullopt;
        v = (*x.shape)[i];
      }
      if (v == -1 && !inferred) {
        inferred = i;
        out.push_back(1);
        continue;
      }
      if (v < 0) return std::nullopt;
      out.push_back(v);
      const auto product = times(known, v);
      if (!product) return std::nullopt;
      known = *product;
    }
    if (inferred) {
      if (known == 0 || count % known != 0) return std::nullopt;
      out[*inferred] = count / known;
    }
    if (shape_numel(out) != count || out.size() > 2) return std::nullopt;
    if (out.size() == 2) return Fact::of_elems_shaped(*x.elems, out);
    return Fact::of_elems(*x.elems, out.empty());
  }

  std::vector<Fact> same_for_each_output(const ir::Node& n, const Fact& x) {
    if (!x.is_batched()) return {mixed(n, "reads a batched value in a way the analysis does not follow")};
    // In training mode each run draws its own mask, unless the ratio is 0 (torchvision's Swin
    // exports its attention dropout so: training_mode true, ratio 0, an identity).
    const Fact* ratio = input(n, 1);
    const bool keeps_all = ratio && ratio->small && ratio->small->numel() == 1 && ratio->small->to_float_vector()[0] == 0.f;
    if (n.op_type == "Dropout" && input(n, 2) && input(n, 2)->values() != std::vector<int64_t>{0} && !keeps_all)
      return {mixed(n, "may run in training mode")};
    return std::vector<Fact>(std::max<size_t>(1, n.outputs.size()), x);
  }

  // The batched inputs line up on one output axis; the static ones have size 1 there (or no axis).
  Fact broadcast(const ir::Node& n) {
    size_t out_rank = 0;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (!f) continue;
      if (!f->rank) return mixed(n, "broadcasts a value of unknown rank with batched ones");
      out_rank = std::max(out_rank, *f->rank);
    }
    std::optional<size_t> axis;
    const Fact* first = nullptr;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (!f || !f->is_batched()) continue;
      const size_t at = f->axis + (out_rank - *f->rank);
      if (axis && *axis != at) return mixed(n, "combines batches along different axes");
      if (first && !first->shares_batch_with(*f)) return mixed(n, "combines batches merged with other axes differently");
      axis = at;
      first = f;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (!f || f->is_batched()) continue;
      if (!f->batch_invariant) return mixed(n, "combines the samples with a value that depends on the batch size");
      const size_t lead = out_rank - *f->rank;
      if (*axis < lead) continue;  // no axis there: broadcast along the batch
      if (!f->shape) return mixed(n, "broadcasts a value of unknown shape with batched ones");
      if ((*f->shape)[*axis - lead] != 1) return mixed(n, "reads a value with its own size along the batch axis");
    }
    // A per-axis QuantizeLinear / DequantizeLinear along the batch axis would need N scales.
    if (is_one_of(n.op_type, {"QuantizeLinear", "DequantizeLinear"}) && input(n, 1) && input(n, 1)->shape &&
        !input(n, 1)->shape->empty() && shape_numel(*input(n, 1)->shape) != 1) {
      const auto a = normalized(n.attr_int("axis", 1), out_rank);
      if (!a || *a == *axis) return mixed(n, "has per-axis parameters along the batch axis");
    }
    // The broadcast sizes: the batch's at its axis; elsewhere a known size other than 1 wins. A
    // QuantizeLinear / DequantizeLinear has its input's: per-axis parameters align with `axis`,
    // not with the last axes.
    const bool quantizer = is_one_of(n.op_type, {"QuantizeLinear", "DequantizeLinear"});
    std::vector<Elem> dims(out_rank, Elem::of(1));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (!f || (quantizer && i > 0)) continue;
      const size_t lead = out_rank - *f->rank;
      for (size_t k = 0; k < *f->rank; ++k) {
        const Elem d = f->dim(k);
        Elem& out = dims[lead + k];
        if (lead + k == *axis) out = Elem::batch(first->outer * first->inner);
        else if (d.kind == Elem::kValue && d.value != 1) out = d;
        else if (d.kind != Elem::kValue && out.is(1)) out = Elem::unknown();
      }
    }
    return first->moved(*axis, out_rank).sized(dims);
  }

  std::vector<Fact> per_image_op(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched() || x.axis != 0) return {mixed(n, "does not have its batch first")};
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (input(n, i) && !input(n, i)->invariant_static())
        return {mixed(n, "takes a per-sample value as a parameter")};
    if (n.op_type == "BatchNormalization" && (n.attr_int("training_mode", 0) != 0 || n.outputs.size() > 1))
      return {mixed(n, "normalizes over the batch (training mode)")};
    if (n.op_type == "MaxPool" && n.outputs.size() > 1 && !n.outputs[1].empty())
      return {mixed(n, "returns indices over the whole batch")};
    return {x.moved(0, x.rank).sized(per_image_dims(n, x))};
  }

  // Sizes of a per-image op's output where they follow from its input's and its attributes.
  std::optional<std::vector<Elem>> per_image_dims(const ir::Node& n, const Fact& x) {
    if (!x.dims || x.dims->size() < 2) return std::nullopt;
    std::vector<Elem> d = *x.dims;
    if (is_one_of(n.op_type, {"BatchNormalization", "InstanceNormalization", "LRN", "GroupNormalization"})) return d;
    if (is_one_of(n.op_type, {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})) {
      std::fill(d.begin() + 2, d.end(), Elem::of(1));
      return d;
    }
    const bool conv = n.op_type == "Conv";
    if (!conv && !is_one_of(n.op_type, {"MaxPool", "AveragePool", "LpPool"})) return std::nullopt;
    std::vector<int64_t> kernel = n.attr_ints("kernel_shape");
    if (conv) {
      const Fact* w = input(n, 1);
      if (!w || !w->shape || w->shape->size() != d.size()) return std::nullopt;
      d[1] = Elem::of((*w->shape)[0]);
      kernel.assign(w->shape->begin() + 2, w->shape->end());
    }
    const size_t spatial = d.size() - 2;
    const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
    if (kernel.size() != spatial || (auto_pad != "NOTSET" && auto_pad != "VALID")) return std::nullopt;
    const auto strides = n.attr_ints("strides", std::vector<int64_t>(spatial, 1));
    const auto dilations = n.attr_ints("dilations", std::vector<int64_t>(spatial, 1));
    const auto pads = n.attr_ints("pads", std::vector<int64_t>(2 * spatial, 0));
    const bool ceil_mode = n.attr_int("ceil_mode", 0) != 0;
    if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial) return std::nullopt;
    for (size_t i = 0; i < spatial; ++i) {
      Elem& e = d[2 + i];
      if (e.kind != Elem::kValue || strides[i] < 1 || ceil_mode) {  // ceil mode: rules differ by opset
        e = Elem::unknown();
        continue;
      }
      const int64_t padded = e.value + (auto_pad == "VALID" ? 0 : pads[i] + pads[i + spatial]);
      const int64_t span = padded - dilations[i] * (kernel[i] - 1) - 1;
      if (span < 0) return std::nullopt;
      e = Elem::of(span / strides[i] + 1);
    }
    return d;
  }

  std::optional<std::vector<int64_t>> axes_of(const ir::Node& n, size_t input_index) {
    if (n.has_attr("axes")) return n.attr_ints("axes");
    if (n.inputs.size() > input_index && !n.input(input_index).empty()) return fact(n.input(input_index)).values();
    return std::vector<int64_t>{};
  }

  Fact reduce(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched()) return mixed(n, "reduces a value the analysis does not follow");
    std::vector<int64_t> axes;
    if (is_one_of(n.op_type, {"ArgMax", "ArgMin"})) {
      axes = {n.attr_int("axis", 0)};
    } else {
      const auto a = axes_of(n, 1);
      if (!a) return mixed(n, "reduces over axes not known here");
      axes = *a;
      if (axes.empty()) {
        if (n.attr_int("noop_with_empty_axes", 0) != 0) return x;
        return mixed(n, "reduces over every axis, the batch's too");
      }
    }
    std::set<size_t> reduced;
    for (int64_t a : axes) {
      const auto k = normalized(a, x.rank);
      if (!k || *k == x.axis) return mixed(n, "reduces over the batch axis");
      reduced.insert(*k);
    }
    const auto below = static_cast<size_t>(std::count_if(reduced.begin(), reduced.end(), [&](size_t k) { return k < x.axis; }));
    const bool keep = n.attr_int("keepdims", 1) != 0;
    std::optional<size_t> rank = x.rank;
    if (!keep && rank) *rank -= reduced.size();
    std::optional<std::vector<Elem>> dims;
    if (x.dims) {
      dims.emplace();
      for (size_t i = 0; i < x.dims->size(); ++i)
        if (!reduced.count(i)) dims->push_back((*x.dims)[i]);
        else if (keep) dims->push_back(Elem::of(1));
    }
    return x.moved(keep ? x.axis : x.axis - below, rank).sized(dims);
  }

  Fact matmul(const ir::Node& n, size_t a_index, size_t b_index) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (i == a_index || i == b_index || !f) continue;
      if (!f->invariant_static()) return mixed(n, "takes a per-sample value as a parameter");
      // A's zero point / scale may be per row: along the batch when A's rows are samples.
      const bool a_side = a_index + 1 == b_index ? i == 2 : i < b_index;
      if (a_side && (!f->shape || shape_numel(*f->shape) != 1)) return mixed(n, "has per-row parameters for A");
    }
    const Fact& a = *input(n, a_index);
    const Fact& b = *input(n, b_index);
    if (!a.rank || !b.rank || *a.rank < 2 || *b.rank < 2) {
      if (a.is_batched() && a.rank && *a.rank >= 2 && a.axis + 1 < *a.rank && b.invariant_static() &&
          b.rank == size_t{1})
        return a.moved(a.axis, *a.rank - 1).sized(product_dims(a, b, *a.rank));  // [.., M, K] x [K]: rows stay rows
      return mixed(n, "multiplies values whose ranks the analysis does not follow");
    }
    const size_t r = std::max(*a.rank, *b.rank);
    auto aligned = [&](const Fact& f) { return f.axis + (r - *f.rank); };
    if (a.is_batched() && b.is_batched()) {
      if (aligned(a) != aligned(b) || aligned(a) + 2 >= r) return mixed(n, "multiplies batches along other axes");
      if (!a.shares_batch_with(b)) return mixed(n, "multiplies batches merged with other axes differently");
      return a.moved(aligned(a), r).sized(product_dims(a, b, r));
    }
    if (a.is_batched()) {
      if (!b.batch_invariant) return mixed(n, "multiplies by a value that depends on the batch size");
      if (a.axis + 1 == *a.rank) return mixed(n, "contracts the batch axis");
      const size_t at = aligned(a);
      if (at + 2 < r) {  // a broadcast (stacking) axis: b must have size 1 there, or no axis
        const size_t lead = r - *b.rank;
        if (at >= lead && (!b.shape || (*b.shape)[at - lead] != 1))
          return mixed(n, "multiplies by a value with its own size along the batch axis");
      }
      return a.moved(at, r).sized(product_dims(a, b, r));
    }
    // b batched, a static: the batch along b's stacking axes stays; along its rows or columns not.
    if (!a.batch_invariant || b.axis + 2 >= *b.rank) return mixed(n, "multiplies a batch from the right");
    const size_t at = aligned(b), lead = r - *a.rank;
    if (at >= lead && (!a.shape || (*a.shape)[at - lead] != 1))
      return mixed(n, "multiplies by a value with its own size along the batch axis");
    return b.moved(at, r).sized(product_dims(a, b, r));
  }

  // MatMul's output sizes: the stacking axes broadcast, then A's rows and B's columns (B of rank
  // 1: A's sizes without its last).
  static std::vector<Elem> product_dims(const Fact& a, const Fact& b, size_t r) {
    std::vector<Elem> d;
    if (b.rank == size_t{1}) {
      for (size_t i = 0; i + 1 < r; ++i) d.push_back(a.dim(i));
      return d;
    }
    const size_t ra = *a.rank, rb = *b.rank;
    for (size_t i = 0; i + 2 < r; ++i) {
      const Elem da = i >= r - ra ? a.dim(i - (r - ra)) : Elem::of(1);
      const Elem db = i >= r - rb ? b.dim(i - (r - rb)) : Elem::of(1);
      if (da.kind == Elem::kBatch || (da.kind == Elem::kValue && da.value != 1)) d.push_back(da);
      else if (db.kind == Elem::kBatch || (db.kind == Elem::kValue && db.value != 1)) d.push_back(db);
      else d.push_back(da.is(1) && db.is(1) ? Elem::of(1) : Elem::unknown());
    }
    d.push_back(a.dim(ra - 2));
    d.push_back(b.dim(rb - 1));
    return d;
  }

  Fact gemm(const ir::Node& n) {
    const Fact& a = *input(n, 0);
    if (!a.is_batched() || a.axis != (n.attr_int("transA", 0) ? 1u : 0u))
      return mixed(n, "does not have the batch along A's rows");
    if (!input(n, 1)->invariant_static()) return mixed(n, "takes a per-sample B");
    if (const Fact* c = input(n, 2)) {
      if (!c->invariant_static() || !c->shape) return mixed(n, "adds a C the analysis does not know");
      if (c->shape->size() == 2 && (*c->shape)[0] != 1) return mixed(n, "adds a C with its own rows");
    }
    const Fact& w = *input(n, 1);
    Elem columns = Elem::unknown();
    if (w.shape && w.shape->size() == 2) columns = Elem::of((*w.shape)[n.attr_int("transB", 0) ? 0 : 1]);
    return a.moved(0, 2).sized(std::vector<Elem>{a.dim(a.axis), columns});
  }

  // [N, ...] at axis 1 keeps the batch on the rows; elsewhere the axes merged around it are counted
  // (their sizes must be known).
  Fact flatten(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched() || !x.rank) return mixed(n, "flattens a value the analysis does not follow");
    const auto axis = normalized(n.attr_int("axis", 1), *x.rank + 1);
    if (!axis) return mixed(n, "flattens at an axis out of range");
    std::optional<std::vector<Elem>> merged;
    if (x.dims) merged = std::vector<Elem>{product(*x.dims, 0, *axis), product(*x.dims, *axis, *x.rank)};
    if (x.axis == 0 && *axis == 1) return x.moved(0, 2).sized(merged);
    if (!merged) return mixed(n, "merges the batch axis with axes of sizes not known here");
    return regroup(n, x, *merged);
  }

  // The product of d[from, to) as an element: a value, a multiple of N, or unknown.
  static Elem product(const std::vector<Elem>& d, size_t from, size_t to) {
    int64_t p = 1;
    bool batch = false;
    for (size_t i = from; i < to; ++i) {
      if (d[i].kind == Elem::kBatch && !batch) batch = true;
      else if (d[i].kind != Elem::kValue) return d[i].invariant() ? Elem::unknown() : Elem{};
      const auto next = times(p, d[i].value);
      if (!next) return Elem::unknown();
      p = *next;
    }
    return batch ? Elem::batch(p) : Elem::of(p);
  }

  // x's elements read in row-major order as `target` (a size per axis: values and one multiple of
  // N). Sample s owns the runs of `stride` elements (stride = inner times the sizes after the batch
  // axis) at s, s + N, s + 2N, ...; the target keeps the samples apart when one of its axes, the
  // multiple k N at b, holds those runs whole: the sizes after b divide the stride, their quotient
  // (the new inner) divides k, and the sizes before b times k / inner repeat the runs as often as
  // the input did (outer times the sizes before its batch axis).
  Fact regroup(const ir::Node& n, const Fact& x, const std::vector<Elem>& target) {
    if (!x.dims) return mixed(n, "reshapes a batch whose other sizes are not known here");
    const std::vector<Elem>& d = *x.dims;
    const Elem before = product(d, 0, x.axis), after = product(d, x.axis + 1, d.size());
    if (before.kind != Elem::kValue || after.kind != Elem::kValue)
      return mixed(n, "reshapes a batch whose other sizes are not known here");
    const auto stride_known = times(x.inner, after.value), repeats_known = times(x.outer, before.value);
    if (!stride_known || !repeats_known) return mixed(n, "reshapes a batch whose other sizes are not known here");
    const int64_t stride = *stride_known, repeats = *repeats_known;
    std::optional<size_t> at;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i].kind == Elem::kBatch && !at) at = i;
      else if (target[i].kind != Elem::kValue) return mixed(n, "reshapes to a size that depends on the batch size");
    }
    if (!at) return mixed(n, "reshapes the batch axis away (a size fixed for one batch)");
    const int64_t k = target[*at].value;
    const int64_t lead = product(target, 0, *at).value, trail = product(target, *at + 1, target.size()).value;
    if (k < 1 || stride < 1 || trail < 1 || stride % trail != 0 || k % (stride / trail) != 0 ||
        times(lead, k / (stride / trail)) != repeats)
      return mixed(n, "reshapes the batch axis across samples");
    Fact f = Fact::batched(*at, target.size());
    f.inner = stride / trail;
    f.outer = k / f.inner;
    return f.sized(target);
  }

  // The batch stays where the target copies it (0) or names its size (k N) with the axes before it
  // copied and the rest not depending on N; otherwise, with the input's sizes known, the target is
  // resolved (0 copied, -1 inferred) and regrouped.
  Fact reshape(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const Fact& t = *input(n, 1);
    if (!x.is_batched() || !t.is_static() || !t.elems) return mixed(n, "reshapes with a target the analysis does not follow");
    const std::vector<Elem>& e = *t.elems;
    const bool allowzero = n.attr_int("allowzero", 0) != 0;
    if (e.empty()) return mixed(n, "reshapes a batch to a scalar");
    auto copied = [&](size_t i) { return e[i].is(0) && !allowzero; };
    // Resolved sizes: 0 copied, -1 inferred from the total (nullopt where that is not known).
    std::optional<std::vector<Elem>> sizes = std::vector<Elem>{};
    std::optional<size_t> inferred;
    for (size_t i = 0; i < e.size() && sizes; ++i) {
      if (copied(i)) sizes->push_back(x.dim(i));
      else if (e[i].is(-1) && !inferred) {
        inferred = i;
        sizes->push_back(Elem::unknown());
      } else {
        sizes->push_back(e[i]);
      }
    }
    if (inferred && x.dims) {
      const Elem total = product(*x.dims, 0, x.dims->size());
      std::vector<Elem> others = *sizes;
      others.erase(others.begin() + static_cast<std::ptrdiff_t>(*inferred));
      const Elem known = product(others, 0, others.size());
      Elem& slot = (*sizes)[*inferred];
      if (total.kind == Elem::kBatch && known.kind == Elem::kValue && known.value > 0 && total.value % known.value == 0)
        slot = Elem::batch(total.value / known.value);
      else if (total.kind == Elem::kBatch && known.kind == Elem::kBatch && known.value > 0 &&
               total.value % known.value == 0)
        slot = Elem::of(total.value / known.value);
    }
    // The plain case: the axes up to the batch's copied, the batch's the same size, the rest invariant.
    bool plain = x.axis < e.size();
    for (size_t i = 0; plain && i < e.size(); ++i) {
      if (i < x.axis) plain = copied(i);
      else if (i == x.axis) plain = copied(i) || (e[i].kind == Elem::kBatch && e[i].value == x.outer * x.inner);
      else plain = e[i].invariant();
    }
    if (plain) return x.moved(x.axis, e.size()).sized(sizes);
    if (!x.dims || !sizes) return mixed(n, "reshapes the batch axis (a target the analysis cannot resolve without the input's sizes)");
    return regroup(n, x, *sizes);
  }

  Fact transpose(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched()) return mixed(n, "transposes a value the analysis does not follow");
    std::vector<int64_t> perm = n.attr_ints("perm");
    if (perm.empty()) {
      if (!x.rank) return mixed(n, "reverses axes of unknown rank");
      for (size_t i = *x.rank; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
    }
    std::optional<std::vector<Elem>> dims;
    if (x.dims && perm.size() == x.dims->size()) {
      dims.emplace();
      for (int64_t p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(x.dims->size())) return mixed(n, "has a permutation out of range");
        dims->push_back((*x.dims)[static_cast<size_t>(p)]);
      }
    }
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] == static_cast<int64_t>(x.axis)) return x.moved(i, perm.size()).sized(dims);
    return mixed(n, "has a permutation without the batch axis");
  }

  Fact squeeze(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const auto axes = axes_of(n, 1);
    if (!x.is_batched() || !axes || axes->empty() || !x.rank)
      return mixed(n, "squeezes axes not known here (a batch of one would lose its axis)");
    std::set<size_t> squeezed;
    for (int64_t a : *axes) {
      const auto k = normalized(a, x.rank);
      if (!k || *k == x.axis) return mixed(n, "squeezes the batch axis");
      squeezed.insert(*k);
    }
    std::optional<std::vector<Elem>> dims;
    if (x.dims) {
      dims.emplace();
      for (size_t i = 0; i < x.dims->size(); ++i)
        if (!squeezed.count(i)) dims->push_back((*x.dims)[i]);
    }
    const auto below = static_cast<size_t>(std::count_if(squeezed.begin(), squeezed.end(), [&](size_t k) { return k < x.axis; }));
    return x.moved(x.axis - below, *x.rank - squeezed.size()).sized(dims);
  }

  Fact unsqueeze(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const auto axes = axes_of(n, 1);
    if (!x.is_batched() || !axes || !x.rank) return mixed(n, "unsqueezes axes not known here");
    const size_t out_rank = *x.rank + axes->size();
    std::set<size_t> inserted;
    for (int64_t a : *axes) {
      const auto k = normalized(a, out_rank);
      if (!k) return mixed(n, "has an axis out of range");
      inserted.insert(*k);
    }
    if (inserted.size() != axes->size()) return mixed(n, "inserts an axis twice");
    std::optional<std::vector<Elem>> dims;
    if (x.dims) dims.emplace();
    std::optional<size_t> at;
    size_t kept = 0;
    for (size_t i = 0; i < out_rank; ++i) {
      if (inserted.count(i)) {
        if (dims) dims->push_back(Elem::of(1));
        continue;
      }
      if (dims) dims->push_back((*x.dims)[kept]);
      if (kept++ == x.axis) at = i;
    }
    if (!at) return mixed(n, "has an axis out of range");
    return x.moved(*at, out_rank).sized(dims);
  }

  Fact concat(const ir::Node& n) {
    const Fact* x = nullptr;
    for (size_t i = 0; i < n.inputs.size() && !x; ++i)
      if (input(n, i) && input(n, i)->is_batched()) x = input(n, i);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (f && !f->is_batched()) return mixed(n, "joins a batch with a value of its own size along the batch axis");
      if (f && (f->axis != x->axis || !f->shares_batch_with(*x))) return mixed(n, "joins batches along different axes");
    }
    const auto axis = normalized(n.attr_int("axis", 0), x->rank);
    if (!axis || *axis == x->axis) return mixed(n, "joins batches along the batch axis");
    std::optional<std::vector<Elem>> dims = x->dims;
    if (dims) {
      (*dims)[*axis] = Elem::of(0);
      for (size_t i = 0; i < n.inputs.size() && dims; ++i) {
        const Fact* f = input(n, i);
        if (!f) continue;
        const Elem d = f->dim(*axis);
        Elem& sum = (*dims)[*axis];
        if (d.kind == Elem::kValue && sum.kind == Elem::kValue) sum.value += d.value;
        else sum = Elem::unknown();
      }
    }
    return x->sized(dims);
  }

  std::vector<Fact> split(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const auto axis = normalized(n.attr_int("axis", 0), x.rank);
    if (!x.is_batched() || !axis || *axis == x.axis) return {mixed(n, "splits along the batch axis")};
    if (input(n, 1) && !input(n, 1)->invariant_static()) return {mixed(n, "splits by sizes that depend on the batch")};
    std::optional<std::vector<int64_t>> sizes;
    if (n.has_attr("split")) sizes = n.attr_ints("split");
    else if (input(n, 1)) sizes = input(n, 1)->values();
    const Elem whole = x.dim(*axis);
    if (!sizes && !input(n, 1) && whole.kind == Elem::kValue && !n.outputs.empty() &&
        whole.value % static_cast<int64_t>(n.outputs.size()) == 0)
      sizes = std::vector<int64_t>(n.outputs.size(), whole.value / static_cast<int64_t>(n.outputs.size()));
    std::vector<Fact> out;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      std::optional<std::vector<Elem>> dims = x.dims;
      if (dims) (*dims)[*axis] = sizes && sizes->size() == n.outputs.size() ? Elem::of(sizes->at(k)) : Elem::unknown();
      out.push_back(x.sized(dims));
    }
    return out;
  }

  // Slices along other axes (by bounds not depending on N) keep the batch; along the batch axis only the whole of it (from 0 to
  // N or past the end, step 1).
  Fact slice(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched()) return mixed(n, "slices a value the analysis does not follow");
    const auto b = slice_bounds(n);
    if (!b) return mixed(n, "slices by bounds not known here");
    std::optional<std::vector<Elem>> dims = x.dims;
    for (size_t i = 0; i < b->starts.size(); ++i) {
      const auto k = b->axes.empty() ? std::optional<size_t>(i) : normalized(b->axes[i], x.rank);
      if (!k) return mixed(n, "slices an axis out of range");
      const Elem &start = b->starts[i], &end = b->ends[i];
      const Elem step = b->steps.empty() ? Elem::of(1) : b->steps[i];
      if (*k != x.axis) {
        if (!start.invariant() || !end.invariant() || !step.invariant())
          return mixed(n, "slices another axis by bounds that depend on the batch size");
        if (dims) (*dims)[*k] = slice_length((*dims)[*k], start, end, step);
        continue;
      }
      const bool from_0 = start.is(0);
      const bool to_end = (end.kind == Elem::kBatch && end.value >= x.outer * x.inner) ||
                          (end.kind == Elem::kValue && end.value >= (int64_t{1} << 31) - 1);
      if (!(from_0 && to_end && step.is(1))) return mixed(n, "slices the batch axis");
    }
    return x.sized(dims);
  }

  // The indices ONNX Slice keeps along an axis of `dim` entries (step not 0): negative bounds count
  // from the end, then clamp to what the step's direction can reach.
  static std::vector<int64_t> slice_indices(int64_t dim, int64_t start, int64_t end, int64_t step) {
    auto clamped = [&](int64_t v, int64_t lo, int64_t hi) { return std::clamp(v < 0 ? v + dim : v, lo, hi); };
    const bool forward = step > 0;
    int64_t at = forward ? clamped(start, 0, dim) : clamped(start, -1, dim - 1);
    const int64_t last = forward ? clamped(end, 0, dim) : clamped(end, -1, dim - 1);
    const int64_t stride = std::clamp(step, -(dim + 1), dim + 1);  // past the end in one step either way
    std::vector<int64_t> kept;
    for (; forward ? at < last : at > last; at += stride) kept.push_back(at);
    return kept;
  }

  // ONNX Slice's length along one axis, where the size and the bounds are known.
  static Elem slice_length(const Elem& size, const Elem& start, const Elem& end, const Elem& step) {
    if (size.kind != Elem::kValue || start.kind != Elem::kValue || end.kind != Elem::kValue ||
        step.kind != Elem::kValue || step.value == 0)
      return Elem::unknown();
    return Elem::of(static_cast<int64_t>(slice_indices(size.value, start.value, end.value, step.value).size()));
  }

  Fact gather(const ir::Node& n) {
    const Fact& data = *input(n, 0);
    const Fact& idx = *input(n, 1);
    const auto axis = normalized(n.attr_int("axis", 0), data.rank);
    if (!axis || !idx.rank) return mixed(n, "gathers along an axis the analysis does not follow");
    if (!data.rank) return mixed(n, "gathers from a value of unknown rank");
    const size_t out_rank = *data.rank - 1 + *idx.rank;
    // data's sizes with the gathered axis replaced by the indices'.
    auto gathered_dims = [&]() {
      std::vector<Elem> d;
      for (size_t i = 0; i < *axis; ++i) d.push_back(data.dim(i));
      for (size_t i = 0; i < *idx.rank; ++i) d.push_back(idx.dim(i));
      for (size_t i = *axis + 1; i < *data.rank; ++i) d.push_back(data.dim(i));
      return d;
    };
    if (data.is_batched() && idx.invariant_static()) {
      if (*axis == data.axis) return mixed(n, "gathers along the batch axis");
      const size_t at = data.axis < *axis ? data.axis : data.axis - 1 + *idx.rank;
      return data.moved(at, out_rank).sized(gathered_dims());
    }
    if (data.invariant_static() && idx.is_batched())  // an embedding lookup
      return idx.moved(*axis + idx.axis, out_rank).sized(gathered_dims());
    return mixed(n, "gathers batched values by batched indices");
  }

  Fact expand(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const Fact& s = *input(n, 1);
    if (!s.is_static() || !s.elems || !x.rank) return mixed(n, "expands to a shape the analysis does not follow");
    const std::vector<Elem>& e = *s.elems;
    const size_t r = std::max(*x.rank, e.size());
    const size_t lead_x = r - *x.rank, lead_s = r - e.size();
    std::optional<size_t> axis;
    if (x.is_batched()) axis = x.axis + lead_x;
    for (size_t i = 0; i < e.size(); ++i) {
      const size_t at = i + lead_s;
      if (e[i].kind == Elem::kBatch) {
        if (axis && *axis != at) return mixed(n, "expands along a second batch axis");
        if (x.is_batched() ? e[i].value != x.outer * x.inner : !e[i].is_n())
          return mixed(n, "expands the batch axis to another multiple of the batch size");
        if (!x.is_batched() && (at >= lead_x && (!x.shape || (*x.shape)[at - lead_x] != 1)))
          return mixed(n, "expands a value with its own size along the batch axis");
        axis = at;
      } else if (!e[i].invariant()) {
        return mixed(n, "expands to a size that depends on the batch size");
      } else if (x.is_batched() && at == *axis && !(e[i].kind == Elem::kValue && e[i].value == 1)) {
        return mixed(n, "expands the batch axis");
      }
    }
    if (!axis) return mixed(n, "expands without a batch axis");
    std::vector<Elem> dims;
    for (size_t at = 0; at < r; ++at) {
      const Elem from_x = at >= lead_x ? x.dim(at - lead_x) : Elem::of(1);
      const Elem to = at >= lead_s ? e[at - lead_s] : Elem::of(1);
      if (at == *axis) dims.push_back(x.is_batched() ? from_x : to);
      else if (to.kind == Elem::kValue && to.value != 1) dims.push_back(to);
      else if (from_x.kind == Elem::kValue && from_x.value != 1) dims.push_back(from_x);
      else dims.push_back(from_x.is(1) && to.is(1) ? Elem::of(1) : Elem::unknown());
    }
    return (x.is_batched() ? x.moved(*axis, r) : Fact::batched(*axis, r)).sized(dims);
  }

  Fact resize(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched() || !x.rank) return mixed(n, "resizes a value the analysis does not follow");
    // Upsample (opset < 10: scales attribute) and Resize's roi / scales / sizes.
    if (n.has_attr("scales")) {
      const auto sc = n.attr_floats("scales");
      if (x.axis >= sc.size() || sc[x.axis] != 1.f) return mixed(n, "scales the batch axis");
      return x.moved(x.axis, x.rank);
    }
    const size_t scales_at = n.op_type == "Upsample" ? 1 : 2;
    if (const Fact* sizes = n.op_type == "Resize" ? input(n, 3) : nullptr) {
      if (!sizes->elems || sizes->elems->size() != *x.rank) return mixed(n, "resizes to sizes not known here");
      const Elem& b = (*sizes->elems)[x.axis];
      for (size_t i = 0; i < sizes->elems->size(); ++i)
        if (i != x.axis && !(*sizes->elems)[i].invariant()) return mixed(n, "resizes to sizes that depend on the batch");
      if (b.kind != Elem::kBatch || b.value != x.outer * x.inner) return mixed(n, "resizes the batch axis to a fixed size");
      return x.moved(x.axis, x.rank);
    }
    const Fact* scales = input(n, scales_at);
    if (!scales || !scales->small) return mixed(n, "resizes by scales not known here");
    const std::vector<float> factor = scales->small->to_float_vector();
    if (factor.size() != *x.rank || factor[x.axis] != 1.f) return mixed(n, "may scale the batch axis");
    return x.moved(x.axis, x.rank);
  }

  Fact softmax(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched()) return mixed(n, "normalizes a value the analysis does not follow");
    const bool coerced = g_.opset < 13;  // the rows are the axes before `axis`, flattened
    const auto axis = normalized(n.attr_int("axis", coerced ? 1 : -1), x.rank);
    if (!axis) return mixed(n, "normalizes along an axis out of range");
    if (coerced ? x.axis >= *axis : x.axis == *axis) return mixed(n, "normalizes across the batch");
    return x;
  }

  std::vector<Fact> layer_norm(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const auto axis = normalized(n.attr_int("axis", -1), x.rank);
    if (!x.is_batched() || !axis || x.axis >= *axis) return {mixed(n, "normalizes across the batch")};
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (input(n, i) && !input(n, i)->invariant_static()) return {mixed(n, "takes a per-sample parameter")};
    std::vector<Fact> out(n.outputs.size(), x.moved(x.axis, x.rank));  // mean, inverse deviation: other sizes
    if (!out.empty()) out[0] = x;
    return out;
  }

  Fact pad(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    if (!x.is_batched() || !x.rank) return mixed(n, "pads a value the analysis does not follow");
    if (input(n, 3)) return mixed(n, "pads chosen axes");  // opset 18's axes: not followed
    const auto pads = n.has_attr("pads") ? std::optional(n.attr_ints("pads"))
                                         : (input(n, 1) ? input(n, 1)->values() : std::nullopt);
    if (!pads || pads->size() != 2 * *x.rank) return mixed(n, "pads by amounts not known here");
    if (pads->at(x.axis) != 0 || pads->at(x.axis + *x.rank) != 0) return mixed(n, "pads the batch axis");
    if (input(n, 2) && !input(n, 2)->invariant_static()) return mixed(n, "pads with a per-sample value");
    std::optional<std::vector<Elem>> dims = x.dims;
    if (dims)
      for (size_t i = 0; i < dims->size(); ++i) {
        Elem& d = (*dims)[i];
        if (i != x.axis) d = d.kind == Elem::kValue ? Elem::of(d.value + pads->at(i) + pads->at(i + *x.rank)) : Elem::unknown();
      }
    return x.moved(x.axis, x.rank).sized(dims);
  }

  Fact tile(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    const auto repeats = input(n, 1)->values();
    if (!x.is_batched() || !repeats || x.axis >= repeats->size() || repeats->at(x.axis) != 1)
      return mixed(n, "may repeat the batch axis");
    return x.moved(x.axis, x.rank);
  }

  std::vector<Fact> along_one_axis(const ir::Node& n) {
    const Fact& x = *input(n, 0);
    std::optional<int64_t> axis = n.attr_int("axis", -1);
    if (n.op_type == "CumSum") {
      const auto v = input(n, 1)->values();
      axis = v && v->size() == 1 ? std::optional(v->at(0)) : std::nullopt;
    } else if (input(n, 1) && !input(n, 1)->invariant_static()) {
      return {mixed(n, "takes a k that depends on the batch")};
    }
    const auto k = axis ? normalized(*axis, x.rank) : std::nullopt;
    if (!x.is_batched() || !k || *k == x.axis) return {mixed(n, "runs along the batch axis")};
    return std::vector<Fact>(n.outputs.size(), n.op_type == "CumSum" ? x : x.moved(x.axis, x.rank));
  }

  // LSTM / GRU / RNN: X [seq, batch, input] (layout 0) or [batch, seq, input]; Y [seq, dirs, batch,
  // hidden] or [batch, seq, dirs, hidden]; Y_h, Y_c [dirs, batch, hidden] or [batch, dirs, hidden].
  std::vector<Fact> recurrent(const ir::Node& n) {
    const bool batch_first = n.attr_int("layout", 0) != 0;
    const size_t x_axis = batch_first ? 0 : 1, state_axis = batch_first ? 0 : 1;
    const Fact& x = *input(n, 0);
    if (!x.is_batched() || x.axis != x_axis) return {mixed(n, "does not have the batch where the layout puts it")};
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      const Fact* f = input(n, i);
      if (!f) continue;
      const bool per_sample = i == 4 || i >= 5;  // sequence_lens, initial_h, initial_c, (P: static)
      if (i == 7 || !per_sample) {
        if (!f->invariant_static()) return {mixed(n, "takes per-sample weights")};
      } else if (!f->is_batched() || f->axis != (i == 4 ? 0 : state_axis) || !f->shares_batch_with(x)) {
        return {mixed(n, "takes an initial state or lengths without the batch axis")};
      }
    }
    std::vector<Fact> out{x.moved(batch_first ? 0 : 2, 4)};
    for (size_t k = 1; k < n.outputs.size(); ++k) out.push_back(x.moved(state_axis, 3));
    return out;
  }

  const ir::Graph& g_;
  std::map<std::string, Fact> facts_;
};

}  // namespace

SampleIndependence analyze_sample_independence(const ir::Graph& graph, const BatchAxes& input_axes) {
  return Analysis(graph, input_axes).run();
}

std::map<std::string, Tensor> batch_invariant_sizes(const ir::Graph& graph, const BatchAxes& input_axes) {
  Analysis analysis(graph, input_axes);
  analysis.run();
  return analysis.known_static_values();
}

}  // namespace slimquant::runtime
