// Kernel creation: one step per node a plan runs, with its slots and its kernel (attributes parsed
// and constant weights prepacked once, here, not on every run).
#include "runtime/session_internal.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::runtime {

std::string with_node_context(const ir::Node& node, const std::string& message) {
  const std::string prefix = node.describe();
  if (message.find(prefix) != std::string::npos) return message;
  return prefix + ": " + message;
}

namespace plan {

std::vector<std::string> SlotTable::names() const {
  std::vector<std::string> names(slots_.size());
  for (const auto& [name, s] : slots_) names[s] = name;
  return names;
}

namespace {

Step create_step(const ir::Graph& graph, const ir::Node& node, SlotTable& slots, bool winograd) {
  const KernelFactory* factory = KernelRegistry::instance().find(node.op_type, node.domain);
  if (!factory) check_supported(graph);  // throws with the node named
  Step step{&node, nullptr, {}, {}, {}};
  for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : slots.slot_of(in));
  for (const auto& o : node.outputs) step.outputs.push_back(o.empty() ? -1 : slots.slot_of(o));
  KernelInit init{node, graph.opset, [&](size_t k) -> const Tensor* {
                    return k < node.inputs.size() ? graph.initializer(node.inputs[k]) : nullptr;
                  },
                  winograd};
  try {
    step.kernel = (*factory)(init);
  } catch (const Error& e) {
    throw Error(e.kind(), with_node_context(node, e.what()));
  }
  return step;
}

}  // namespace

std::vector<Step> create_steps(const ir::Graph& graph, const std::vector<bool>& run_node, SlotTable& slots,
                               bool winograd) {
  std::vector<Step> steps;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (run_node[i]) steps.push_back(create_step(graph, graph.nodes[i], slots, winograd));
  return steps;
}

}  // namespace plan
}  // namespace slimquant::runtime
