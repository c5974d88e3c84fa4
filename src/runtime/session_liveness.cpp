// Liveness: which nodes a plan runs for its wanted values, and after which step each value dies
// (its buffer then goes back to the pool for the next step that allocates).
#include <algorithm>

#include "runtime/session_internal.h"

namespace slimquant::runtime::plan {

namespace {

// Throws kInvalidArgument naming a needed value that is neither fed, constant, nor written by a
// node that runs.
void check_needed_available(const ir::Graph& graph, const std::set<std::string>& fed,
                            const std::unordered_set<std::string>& needed, const std::vector<bool>& run_node) {
  std::unordered_set<std::string> available(fed.begin(), fed.end());
  for (const auto& [name, t] : graph.initializers) available.insert(name);
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (run_node[i])
      for (const auto& o : graph.nodes[i].outputs) available.insert(o);
  for (const auto& v : needed)
    if (!v.empty() && !available.count(v)) {
      bool is_input = std::any_of(graph.inputs.begin(), graph.inputs.end(),
                                  [&](const ir::ValueInfo& i) { return i.name == v; });
      fail(ErrorKind::kInvalidArgument, is_input ? "missing input '" + v + "'"
                                                 : "value '" + v + "' is needed but neither fed nor computable "
                                                   "from the fed values");
    }
}

}  // namespace

std::vector<bool> nodes_to_run(const ir::Graph& graph, const std::set<std::string>& fed,
                               const std::vector<std::string>& wanted, const std::vector<std::string>& observed) {
  std::unordered_set<std::string> needed(wanted.begin(), wanted.end());
  needed.insert(observed.begin(), observed.end());
  std::vector<bool> run_node(graph.nodes.size(), false);
  for (int i = static_cast<int>(graph.nodes.size()) - 1; i >= 0; --i) {
    const auto& n = graph.nodes[i];
    bool produces_needed = false, all_fed = true;
    for (const auto& o : n.outputs) {
      if (o.empty()) continue;
      if (needed.count(o) && !fed.count(o) && !graph.is_initializer(o)) produces_needed = true;
      if (!fed.count(o)) all_fed = false;
    }
    if (!produces_needed || all_fed) continue;
    run_node[i] = true;
    for (const auto& in : n.inputs)
      if (!in.empty()) needed.insert(in);
  }
  check_needed_available(graph, fed, needed, run_node);
  return run_node;
}

void schedule_releases(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& pinned) {
  std::vector<int> last_use(slot_count, -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int in : steps[s].inputs)
      if (in >= 0) last_use[in] = static_cast<int>(s);
  for (size_t s = 0; s < steps.size(); ++s) {
    for (int in : steps[s].inputs)
      if (in >= 0 && last_use[in] == static_cast<int>(s) && !pinned.count(in)) steps[s].release.push_back(in);
    // Outputs nobody reads (e.g. an unused optional output) are released right away.
    for (int o : steps[s].outputs)
      if (o >= 0 && last_use[o] < static_cast<int>(s) && !pinned.count(o)) steps[s].release.push_back(o);
  }
}

}  // namespace slimquant::runtime::plan
