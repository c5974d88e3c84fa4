#include "slimquant/ir/rewrite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace slimquant::ir {

GraphIndex::GraphIndex(const Graph& g, std::set<std::string> keep) : g_(&g), keep_(std::move(keep)) { rebuild(); }

void GraphIndex::rebuild() {
  producer_.clear();
  readers_.clear();
  graph_outputs_.clear();
  dead_.assign(g_->nodes.size(), false);
  for (size_t i = 0; i < g_->nodes.size(); ++i) add_entries(static_cast<int>(i));
  for (const auto& o : g_->outputs) graph_outputs_.insert(o.name);
}

void GraphIndex::add_entries(int id) {
  const Node& n = node(id);
  for (const auto& o : n.outputs)
    if (!o.empty()) producer_[o] = id;
  for (const auto& in : n.inputs)
    if (!in.empty()) readers_[in].push_back(id);
}

void GraphIndex::drop_entries(int id) {
  const Node& n = node(id);
  for (const auto& o : n.outputs)
    if (auto it = producer_.find(o); it != producer_.end() && it->second == id) producer_.erase(it);
  for (const auto& in : n.inputs) {
    auto it = readers_.find(in);
    if (it == readers_.end()) continue;
    auto& ids = it->second;
    if (auto pos = std::find(ids.begin(), ids.end(), id); pos != ids.end()) ids.erase(pos);
    if (ids.empty()) readers_.erase(it);
  }
}

int GraphIndex::producer(const std::string& v) const {
  auto it = v.empty() ? producer_.end() : producer_.find(v);
  return it == producer_.end() ? -1 : it->second;
}

std::vector<int> GraphIndex::readers(const std::string& v) const {
  auto it = readers_.find(v);
  if (it == readers_.end()) return {};
  std::vector<int> ids = it->second;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int GraphIndex::reads(const std::string& v) const {
  auto it = readers_.find(v);
  return it == readers_.end() ? 0 : static_cast<int>(it->second.size());
}

bool GraphIndex::is_private(const std::string& v) const { return !graph_outputs_.count(v) && !keep_.count(v); }

int GraphIndex::sole_reader(const std::string& v, bool read_once) const {
  if (!is_private(v)) return -1;
  const std::vector<int> ids = readers(v);
  if (ids.size() != 1 || (read_once && reads(v) != 1)) return -1;
  return ids[0];
}

int GraphIndex::sole_reader_op(const std::string& v, const char* op) const {
  const int r = sole_reader(v);
  return r >= 0 && is_onnx_op(node(r), op) && node(r).outputs.size() == 1 ? r : -1;
}

Rewriter::Rewriter(Graph& g, std::set<std::string> keep)
    : GraphIndex(g, std::move(keep)), graph_(&g), anchor_(g.nodes.size(), -1),
      visited_count_(static_cast<int>(g.nodes.size())) {}

void Rewriter::replace(int id, Node n) {
  drop_entries(id);
  graph_->nodes[static_cast<size_t>(id)] = std::move(n);
  add_entries(id);
}

void Rewriter::remove(int id) {
  if (dead_[static_cast<size_t>(id)]) return;
  drop_entries(id);
  dead_[static_cast<size_t>(id)] = true;
}

int Rewriter::insert_before(int anchor, Node n) {
  // The node vector may reallocate: callers hold ids, never references, across this call.
  graph_->nodes.push_back(std::move(n));
  const int id = static_cast<int>(graph_->nodes.size()) - 1;
  dead_.push_back(false);
  anchor_.push_back(anchor);
  add_entries(id);
  return id;
}

void Rewriter::rename_value(const std::string& from, const std::string& to) {
  std::vector<int> touched = readers(from);
  if (const int p = producer(from); p >= 0) touched.push_back(p);
  for (int id : touched) {
    Node n = node(id);
    for (auto& i : n.inputs)
      if (i == from) i = to;
    for (auto& o : n.outputs)
      if (o == from) o = to;
    replace(id, std::move(n));
  }
}

void Rewriter::compact() {
  std::vector<std::vector<int>> before(graph_->nodes.size());
  for (size_t id = 0; id < anchor_.size(); ++id)
    if (anchor_[id] >= 0) before[static_cast<size_t>(anchor_[id])].push_back(static_cast<int>(id));
  std::vector<Node> nodes;
  nodes.reserve(graph_->nodes.size());
  // Inserted nodes go before their anchor (recursively: one may be anchored at another).
  std::function<void(int)> emit = [&](int id) {
    for (int b : before[static_cast<size_t>(id)]) emit(b);
    if (!dead_[static_cast<size_t>(id)]) nodes.push_back(std::move(graph_->nodes[static_cast<size_t>(id)]));
  };
  for (size_t id = 0; id < anchor_.size(); ++id)
    if (anchor_[id] < 0) emit(static_cast<int>(id));
  graph_->nodes = std::move(nodes);
  anchor_.assign(graph_->nodes.size(), -1);
  visited_count_ = static_cast<int>(graph_->nodes.size());
  rebuild();
}

bool has_execution_attrs(const Node& n) {
  const std::string prefix = kExecutionAttrPrefix;
  return std::any_of(n.attrs.begin(), n.attrs.end(), [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
}

Rule graph_rule(std::string name, std::function<int(Graph&, const std::set<std::string>& keep)> run) {
  Rule r;
  r.name = std::move(name);
  r.run = std::move(run);
  return r;
}

int total(const RuleCounts& counts) {
  int n = 0;
  for (const auto& c : counts) n += c.applied;
  return n;
}

int count_of(const RuleCounts& counts, const std::string& rule) {
  int n = 0;
  for (const auto& c : counts)
    if (c.rule == rule) n += c.applied;
  return n;
}

namespace {
int run_rule(Graph& g, const Rule& rule, const std::set<std::string>& keep) {
  if (rule.run) return rule.run(g, keep);
  Rewriter rw(g, keep);
  int applied = 0;
  for (int id = 0; id < rw.visited_count(); ++id) {
    if (!rw.alive(id)) continue;
    std::optional<std::any> match = rule.select(rw, id);
    if (!match) continue;
    rule.apply(rw, *match);
    ++applied;
  }
  if (applied) {
    rw.compact();
    if (rule.finish) rule.finish(g);
  }
  return applied;
}

bool log_rewrites() {
  const char* v = std::getenv("SLIMQUANT_LOG_REWRITES");
  return v && *v && *v != '0';
}
}  // namespace

RuleCounts apply_rules(Graph& g, const std::vector<Rule>& rules, const std::set<std::string>& keep, bool until_stable) {
  RuleCounts counts;
  for (const auto& r : rules) counts.push_back({r.name, 0});
  for (bool again = true; again;) {
    again = false;
    for (size_t k = 0; k < rules.size(); ++k) {
      const int n = run_rule(g, rules[k], keep);
      counts[k].applied += n;
      again = again || (until_stable && n > 0);
    }
  }
  if (log_rewrites())
    for (const auto& c : counts)
      if (c.applied) std::fprintf(stderr, "rewrite %s: %d\n", c.rule.c_str(), c.applied);
  return counts;
}

std::optional<float> scalar_constant(const Graph& g, const std::string& v) {
  const Tensor* t = v.empty() ? nullptr : g.initializer(v);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return std::nullopt;
  return t->to_float_vector()[0];
}

bool is_scalar_close_to(const Graph& g, const std::string& v, float want, float tolerance) {
  const std::optional<float> c = scalar_constant(g, v);
  return c && std::fabs(*c - want) <= tolerance * std::fabs(want);
}

std::string other_input(const Node& n, const std::string& v) {
  if (n.inputs.size() != 2) return "";
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[1] == v ? n.inputs[0] : "";
}

std::optional<std::vector<float>> per_channel_constant(const Graph& g, const std::string& v, int64_t channels,
                                                       size_t rank) {
  const Tensor* t = v.empty() ? nullptr : g.initializer(v);
  if (!t || t->dtype() != DType::kFloat32 || t->rank() > rank) return std::nullopt;
  const std::vector<float> values = t->to_float_vector();
  if (t->numel() == 1) return std::vector<float>(static_cast<size_t>(channels), values[0]);
  // Aligned from the right: the channel axis (1 in the output) is index 1 - (rank - t.rank) here.
  const int64_t channel_axis = 1 - static_cast<int64_t>(rank - t->rank());
  if (channel_axis < 0 || t->dim(static_cast<size_t>(channel_axis)) != channels || t->numel() != channels)
    return std::nullopt;
  return values;
}

std::optional<std::pair<float, float>> clip_bounds(const Graph& g, const Node& clip) {
  if (g.opset < 11) return std::pair{clip.attr_float("min", -INFINITY), clip.attr_float("max", INFINITY)};
  std::pair<float, float> b{-INFINITY, INFINITY};
  const std::string &lo = clip.input(1), &hi = clip.input(2);
  if ((!lo.empty() && !g.is_initializer(lo)) || (!hi.empty() && !g.is_initializer(hi))) return std::nullopt;
  if (!lo.empty()) b.first = g.initializer(lo)->to_float_vector().at(0);
  if (!hi.empty()) b.second = g.initializer(hi)->to_float_vector().at(0);
  return b;
}

}  // namespace slimquant::ir
