#pragma once
// Graph rewriting: one index, one way to edit, one way to run rules. Every rewrite in slimquant (the
// model passes in ir, the QDQ lowering in quant, the execution fusions in runtime) is a Rule in an
// ordered list that apply_rules runs. Modelled on ONNX Runtime's selector/action transformers, made
// simpler: a selector looks at one anchor node and returns its own match type (nothing = no
// match); an action edits the graph through a Rewriter, which keeps producers and readers up to date
// and never moves nodes until the rule has visited every one (no index arithmetic in rules).
#include <any>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "slimquant/ir/graph.h"

namespace slimquant::ir {

// The one definition of slimquant's own operator domain (fused INT8 nodes, Swish, fused-node
// attributes' owner). Kernels, lowering and passes all spell it through this constant.
inline constexpr const char* kSlimquantDomain = "com.slimquant";

// Every attribute the execution fusions write (the contracts in runtime/fused_ops) starts with this
// prefix: model passes leave a node that carries one alone.
inline constexpr const char* kExecutionAttrPrefix = "slimquant.";
bool has_execution_attrs(const Node& n);

// True for a node of default-domain (ONNX) op `op`.
inline bool is_onnx_op(const Node& n, const char* op) { return n.domain.empty() && n.op_type == op; }

// Producers and readers of every value, built once and kept current by Rewriter's edits (Graph's
// own producer() / consumers() scan every node). Node ids are positions in graph().nodes.
class GraphIndex {
 public:
  // keep: values a caller wants to see (outputs, observed values): never fused away.
  explicit GraphIndex(const Graph& g, std::set<std::string> keep = {});

  const Graph& graph() const { return *g_; }
  const Node& node(int id) const { return g_->nodes[static_cast<size_t>(id)]; }
  bool alive(int id) const { return !dead_[static_cast<size_t>(id)]; }
  // The node writing v, or -1 (graph input, initializer, unknown).
  int producer(const std::string& v) const;
  // The distinct nodes reading v, in node order.
  std::vector<int> readers(const std::string& v) const;
  // How many input slots of all nodes read v (a node reading v twice counts twice).
  int reads(const std::string& v) const;
  // v may be absorbed into a fused node: not a graph output and not kept.
  bool is_private(const std::string& v) const;
  // The one node reading v, when v is private and exactly one node reads it; -1 otherwise. With
  // read_once, that node must also read v in one input slot only.
  int sole_reader(const std::string& v, bool read_once = false) const;
  // sole_reader(v) when it is a default-domain `op` with one output, else -1.
  int sole_reader_op(const std::string& v, const char* op) const;
  const std::set<std::string>& keep() const { return keep_; }

 protected:
  void add_entries(int id);
  void drop_entries(int id);
  void rebuild();

  const Graph* g_;
  std::set<std::string> keep_;
  std::set<std::string> graph_outputs_;
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<int>> readers_;  // one entry per input slot
  std::vector<bool> dead_;
};

// Edits a graph during a rule: removed nodes are marked dead and inserted ones remember where they
// go; compact() then writes the node list once, in topological order. Ids stay valid until then.
class Rewriter : public GraphIndex {
 public:
  Rewriter(Graph& g, std::set<std::string> keep = {});

  Graph& graph() { return *graph_; }
  const Graph& graph() const { return *graph_; }
  // Replaces node id by `n` at id's place in the order (everything n reads must exist there).
  void replace(int id, Node n);
  // Removes node id (its outputs must be unread by then, or taken over by another node).
  void remove(int id);
  // Adds n just before node `anchor` in the order; returns its id (not visited by the running rule).
  int insert_before(int anchor, Node n);
  // Every reader of `from` reads `to` instead; the producer of `from` (if any) writes `to`.
  void rename_value(const std::string& from, const std::string& to);
  // Applies the edits to the node list (dead nodes dropped, inserted ones placed) and re-indexes.
  void compact();
  // Nodes present when the current rule started (ids beyond are inserted ones).
  int visited_count() const { return visited_count_; }

 private:
  Graph* graph_;
  std::vector<int> anchor_;  // per node id: -1 for nodes in the list, else the node it goes before
  int visited_count_ = 0;
};

// One rewrite: a selector recognises a group at an anchor node without editing anything; an action
// replaces the group. A rule whose rewrite needs the whole graph at once (constant folding) gives
// `run` instead and returns how many rewrites it made. `finish`, when set, runs once after a sweep in
// which the rule fired, on the compacted graph (dropping initializers the rewrites left unread).
struct Rule {
  std::string name;
  std::function<std::optional<std::any>(const Rewriter&, int id)> select;
  std::function<void(Rewriter&, std::any& match)> apply;
  std::function<int(Graph&, const std::set<std::string>& keep)> run;
  std::function<void(Graph&)> finish;
};

// A rule from a selector returning std::optional<M> and an action taking the M.
template <typename M>
Rule make_rule(std::string name, std::function<std::optional<M>(const Rewriter&, int)> select,
               std::function<void(Rewriter&, const M&)> apply, std::function<void(Graph&)> finish = nullptr) {
  Rule r;
  r.name = std::move(name);
  r.finish = std::move(finish);
  r.select = [select = std::move(select)](const Rewriter& rw, int id) -> std::optional<std::any> {
    std::optional<M> m = select(rw, id);
    if (!m) return std::nullopt;
    return std::any(std::move(*m));
  };
  r.apply = [apply = std::move(apply)](Rewriter& rw, std::any& m) { apply(rw, std::any_cast<const M&>(m)); };
  return r;
}

// A rule for a rewrite that works on the whole graph (see Rule::run).
Rule graph_rule(std::string name, std::function<int(Graph&, const std::set<std::string>& keep)> run);

// How often each rule fired, in list order (loggable; tests assert on it).
struct RuleCount {
  std::string rule;
  int applied = 0;
};
using RuleCounts = std::vector<RuleCount>;
int total(const RuleCounts& counts);
int count_of(const RuleCounts& counts, const std::string& rule);

// Runs the rules in order. Each sweeps the nodes present when it starts, in order, skipping nodes
// an earlier match removed, and applies its action at every match; the graph is compacted after
// each rule. With until_stable, the list runs again while any rule fired (chains that enable each
// other, e.g. BatchNorm after a bias Add). SLIMQUANT_LOG_REWRITES=1 prints the counts to stderr.
RuleCounts apply_rules(Graph& g, const std::vector<Rule>& rules, const std::set<std::string>& keep = {},
                       bool until_stable = false);

// Match helpers shared by the rule lists.
// The value of a one-element float initializer, or nullopt.
std::optional<float> scalar_constant(const Graph& g, const std::string& v);
// A one-element float initializer within relative `tolerance` of `want`.
bool is_scalar_close_to(const Graph& g, const std::string& v, float want, float tolerance);
// The other input of a two-input node, or "" when `v` is not one of them.
std::string other_input(const Node& n, const std::string& v);
// The per-output-channel values of a float32 constant that broadcasts against a tensor of rank
// `rank` along axis 1 only (a scalar, or [C,1,...] / [1,C,1,...]), expanded to `channels` entries.
std::optional<std::vector<float>> per_channel_constant(const Graph& g, const std::string& v, int64_t channels,
                                                       size_t rank);
// Clip's bounds as constants ({-inf, +inf} for absent ones; attributes before opset 11), or
// nullopt when a bound is computed at run time.
std::optional<std::pair<float, float>> clip_bounds(const Graph& g, const Node& clip);

}  // namespace slimquant::ir
