// Construction-time graph optimisation that needs the runtime's kernels: constant folding (each
// foldable node evaluated once), and the pipeline Session and the quantizers run on a float model.
#include "slimquant/runtime/optimize.h"

#include "runtime/fusions/qb4w_matmul_fusion.h"
#include "runtime/session_internal.h"
#include "slimquant/runtime/session.h"
#include "slimquant/ir/passes.h"
#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {

namespace {

const std::set<std::string> kNondeterministicOps = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                    "RandomUniformLike", "Multinomial", "Bernoulli"};

// Runs node's kernel once on `inputs` (the factory sees the same inputs as constants); all outputs.
std::vector<Tensor> run_kernel_once(const ir::Node& node, int64_t opset, const KernelFactory& factory,
                                    const std::vector<const Tensor*>& inputs) {
  KernelInit init{node, opset, [&](size_t i) { return i < inputs.size() ? inputs[i] : nullptr; }};
  auto kernel = factory(init);
  std::vector<Tensor> outputs(node.outputs.size());
  KernelContext ctx(node, inputs, outputs, [](DType t, const Shape& s) { return Tensor(t, s); });
  kernel->run(ctx);
  return outputs;
}

// Shape / Size of a constant or of a value with a fully known shape; empty when unknown.
std::vector<Tensor> fold_shape_query(const ir::Graph& g, const ir::Node& node, const KernelFactory& factory) {
  const std::string& x = node.inputs[0];
  Shape shape;
  if (const Tensor* t = g.initializer(x)) {
    shape = t->shape();
  } else if (const ir::ValueInfo* vi = g.find_value_info(x); vi && vi->fully_known()) {
    shape = vi->shape();
  } else {
    return {};
  }
  // Evaluate on a zero-filled stand-in: Shape/Size only look at the shape.
  Tensor stand_in(DType::kUInt8, shape);
  std::vector<Tensor> outputs = run_kernel_once(node, g.opset, factory, {&stand_in});
  return {outputs.empty() ? Tensor() : outputs[0]};
}

// The outputs of a node whose (present) inputs are all constants; empty when one is not.
std::vector<Tensor> fold_constant_inputs(const ir::Graph& g, const ir::Node& node, const KernelFactory& factory) {
  std::vector<const Tensor*> inputs;
  for (const auto& in : node.inputs) {
    if (in.empty()) {
      inputs.push_back(nullptr);
      continue;
    }
    const Tensor* t = g.initializer(in);
    if (!t) return {};
    inputs.push_back(t);
  }
  return run_kernel_once(node, g.opset, factory, inputs);
}

// The node's outputs evaluated now, or empty when it cannot or must not fold.
std::vector<Tensor> try_fold(const ir::Graph& g, const ir::Node& node, const FoldOptions& options) {
  const KernelFactory* factory = node.domain.empty() ? KernelRegistry::instance().find(node.op_type) : nullptr;
  const bool foldable = factory && !kNondeterministicOps.count(node.op_type) &&
                        !(options.keep_dequantize_linear && node.op_type == "DequantizeLinear") &&
                        !foldable_into_qb4w_matmul(g, node) &&  // the plan fuses it: 4-bit weights stay 4-bit
                        !node.outputs.empty();
  if (!foldable || node.inputs.empty()) return {};
  try {
    if (node.op_type == "Shape" || node.op_type == "Size") return fold_shape_query(g, node, *factory);
    if (node.op_type != "Constant") return fold_constant_inputs(g, node, *factory);
  } catch (const Error& e) {
    throw Error(e.kind(), with_node_context(node, e.what()));
  }
  return {};
}

// Every named output computed, and small enough to keep in the model.
bool worth_folding(const ir::Node& node, const std::vector<Tensor>& results, const FoldOptions& options) {
  size_t bytes = 0;
  bool complete = !results.empty();
  for (size_t i = 0; i < results.size(); ++i) {
    // A sequence is no initializer: it stays computed at run time.
    if (!node.outputs[i].empty() && (!results[i].defined() || results[i].is_sequence())) complete = false;
    bytes += results[i].defined() ? results[i].nbytes() : 0;
  }
  return complete && bytes <= options.max_folded_bytes;
}

}  // namespace

int fold_constants(ir::Graph& g, const FoldOptions& options) {
  int folded = 0;
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (auto& node : g.nodes) {
    const std::vector<Tensor> results = try_fold(g, node, options);
    if (!worth_folding(node, results, options)) {
      kept.push_back(std::move(node));
      continue;
    }
    for (size_t i = 0; i < results.size(); ++i)
      if (!node.outputs[i].empty()) g.initializers[node.outputs[i]] = results[i].clone();
    ++folded;
  }
  g.nodes = std::move(kept);
  // A folded graph output stays reachable as an initializer; so do folded values in options.keep.
  std::map<std::string, Tensor> kept_values;
  for (const auto& name : options.keep)
    if (const Tensor* t = g.initializer(name)) kept_values.emplace(name, *t);
  g.remove_unused_initializers();
  for (auto& [name, t] : kept_values) g.initializers.emplace(name, std::move(t));
  return folded;
}

int fold_batch_invariant_sizes(ir::Graph& g, const FoldOptions& options) {
  return fold_known_values(g, batch_invariant_sizes(g, input_batch_axes(g.inputs)), options);
}

int fold_known_values(ir::Graph& g, const std::map<std::string, Tensor>& known, const FoldOptions& options) {
  if (known.empty()) return 0;
  int folded = 0;
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (auto& node : g.nodes) {
    const bool all_known = !node.outputs.empty() && std::all_of(node.outputs.begin(), node.outputs.end(), [&](const auto& v) {
      return !v.empty() && known.count(v) && !g.is_graph_output(v) && !options.keep.count(v);
    });
    if (!all_known) {
      kept.push_back(std::move(node));
      continue;
    }
    for (const std::string& v : node.outputs) g.initializers[v] = known.at(v);
    ++folded;
  }
  g.nodes = std::move(kept);
  if (folded == 0) return 0;
  fold_constants(g, options);
  // The Shape nodes whose results folded no longer read their tensors (a Slice's input must have
  // no other reader to be specialised). Kept values folded to constants stay, as in fold_constants.
  std::map<std::string, Tensor> kept_values;
  for (const auto& name : options.keep)
    if (const Tensor* t = g.initializer(name)) kept_values.emplace(name, *t);
  g.remove_dead_nodes(options.keep);
  for (auto& [name, t] : kept_values) g.initializers.emplace(name, std::move(t));
  return folded;
}

void optimize_graph(ir::Graph& g, const FoldOptions& options) {
  ir::apply_rules(g, ir::cleanup_rules());
  fold_constants(g, options);
  // Until stable: a BatchNorm can follow an Add that folds first (DBNet's head:
  // ConvTranspose -> Add(bias) -> BatchNormalization).
  ir::apply_rules(g, ir::conv_folding_rules(), {}, /*until_stable=*/true);
  g.remove_dead_nodes();
}

void check_supported(const ir::Graph& graph) {
  for (const auto& n : graph.nodes) {
    for (const auto& [key, value] : n.attrs)  // If's branches
      if (const auto* branch = std::get_if<std::shared_ptr<const ir::Graph>>(&value)) {
        try {
          check_supported(**branch);
        } catch (const Error& e) {
          fail(e.kind(), n.describe() + " " + key + ": " + e.what());
        }
      }
    if (KernelRegistry::instance().find(n.op_type, n.domain)) continue;
    std::string op = n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type;
    fail(ErrorKind::kUnsupported, "unsupported op " + op + " in node '" + (n.name.empty() ? n.outputs.at(0) : n.name) +
                                      "': slimquant has no kernel for it");
  }
}

}  // namespace slimquant::runtime
