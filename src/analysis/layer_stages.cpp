#include "analysis/layer_stages.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace slimquant::analysis {

LayerStages::LayerStages(const ir::Graph& model, const std::vector<std::string>& feeds, const std::string& output)
    : model_(model), output_(output) {
  const std::unordered_set<std::string> fed(feeds.begin(), feeds.end());
  std::unordered_map<std::string, int> producer;
  for (size_t i = 0; i < model.nodes.size(); ++i)
    for (const auto& o : model.nodes[i].outputs)
      if (!o.empty()) producer[o] = static_cast<int>(i);
  // Backwards from the output, stopping at fed values: what a run fed `feeds` computes.
  std::vector<bool> needed(model.nodes.size(), false);
  std::vector<std::string> stack{output};
  std::unordered_set<std::string> seen;
  while (!stack.empty()) {
    const std::string v = stack.back();
    stack.pop_back();
    if (v.empty() || fed.count(v) || !seen.insert(v).second) continue;
    const auto it = producer.find(v);
    if (it == producer.end() || needed[static_cast<size_t>(it->second)]) continue;
    needed[static_cast<size_t>(it->second)] = true;
    for (const auto& in : model.nodes[static_cast<size_t>(it->second)].inputs) stack.push_back(in);
  }
  for (size_t i = 0; i < needed.size(); ++i)
    if (needed[i]) needed_.push_back(static_cast<int>(i));
  computed_.assign(needed_.size(), false);
}

std::vector<bool> LayerStages::runnable(const std::function<bool(const std::string&)>& available) const {
  std::vector<bool> run(needed_.size(), false);
  std::unordered_set<std::string> made;  // outputs of nodes computed before or runnable now
  for (size_t j = 0; j < needed_.size(); ++j)
    if (computed_[j])
      for (const auto& o : model_.nodes[static_cast<size_t>(needed_[j])].outputs) made.insert(o);
  // Graph order is topological, so one pass finds every node whose inputs are at hand.
  for (size_t j = 0; j < needed_.size(); ++j) {
    if (computed_[j]) continue;
    const ir::Node& n = model_.nodes[static_cast<size_t>(needed_[j])];
    const bool ready = std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) {
      return in.empty() || model_.is_initializer(in) || made.count(in) || available(in);
    });
    if (!ready) continue;
    run[j] = true;
    for (const auto& o : n.outputs) made.insert(o);
  }
  return run;
}

std::optional<LayerStages::Stage> LayerStages::next(const std::function<bool(const std::string&)>& available) const {
  const std::vector<bool> run = runnable(available);
  if (std::find(run.begin(), run.end(), true) == run.end()) return std::nullopt;
  Stage stage;
  stage.runs = run;
  std::set<std::string> produced_now, read_now, read_later;
  for (size_t j = 0; j < needed_.size(); ++j) {
    const ir::Node& n = model_.nodes[static_cast<size_t>(needed_[j])];
    if (run[j]) {
      for (const auto& o : n.outputs) produced_now.insert(o);
      for (const auto& in : n.inputs) read_now.insert(in);
    } else if (!computed_[j]) {
      for (const auto& in : n.inputs) read_later.insert(in);
    }
  }
  stage.final = read_later.empty();
  for (const auto& in : read_now)
    if (!in.empty() && !produced_now.count(in) && !model_.is_initializer(in)) {
      stage.inputs.push_back(in);
      if (!read_later.count(in)) stage.released.push_back(in);
    }
  if (stage.final) {
    stage.outputs = {output_};
  } else {
    for (const auto& v : produced_now)
      if (read_later.count(v)) stage.outputs.push_back(v);
  }
  return stage;
}

void LayerStages::commit(const Stage& stage) {
  for (size_t j = 0; j < needed_.size() && j < stage.runs.size(); ++j)
    if (stage.runs[j]) computed_[j] = true;
}

void LayerStages::reset() { std::fill(computed_.begin(), computed_.end(), false); }

bool LayerStages::started() const { return std::find(computed_.begin(), computed_.end(), true) != computed_.end(); }

}  // namespace slimquant::analysis
