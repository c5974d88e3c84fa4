#include "slimquant/ir/graph.h"

#include <algorithm>
#include <deque>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace slimquant::ir {

bool ValueInfo::fully_known() const {
  if (!dims) return false;
  return std::all_of(dims->begin(), dims->end(), [](const Dim& d) { return d.known(); });
}

Shape ValueInfo::shape() const {
  SQ_CHECK(fully_known(), ErrorKind::kInternal, "shape of '" + name + "' is not fully known");
  Shape s;
  for (const Dim& d : *dims) s.push_back(d.value);
  return s;
}

namespace {
template <typename T>
const T* get_attr(const Node& n, const std::string& k) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return nullptr;
  const T* v = std::get_if<T>(&it->second);
  if (!v) fail(ErrorKind::kInvalidModel, n.describe() + ": attribute '" + k + "' has an unexpected type");
  return v;
}
}  // namespace

int64_t Node::attr_int(const std::string& k, int64_t def) const {
  const int64_t* v = get_attr<int64_t>(*this, k);
  return v ? *v : def;
}
float Node::attr_float(const std::string& k, float def) const {
  auto it = attrs.find(k);
  if (it != attrs.end()) {
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
  }
  const float* v = get_attr<float>(*this, k);
  return v ? *v : def;
}
std::string Node::attr_string(const std::string& k, const std::string& def) const {
  const std::string* v = get_attr<std::string>(*this, k);
  return v ? *v : def;
}
std::vector<int64_t> Node::attr_ints(const std::string& k, std::vector<int64_t> def) const {
  const auto* v = get_attr<std::vector<int64_t>>(*this, k);
  return v ? *v : def;
}
std::vector<float> Node::attr_floats(const std::string& k, std::vector<float> def) const {
  const auto* v = get_attr<std::vector<float>>(*this, k);
  return v ? *v : def;
}
const Tensor* Node::attr_tensor(const std::string& k) const { return get_attr<Tensor>(*this, k); }

const Graph* Node::attr_graph(const std::string& k) const {
  const auto* g = get_attr<std::shared_ptr<const Graph>>(*this, k);
  return g ? g->get() : nullptr;
}

const std::string& Node::input(size_t i) const {
  static const std::string kEmpty;
  return i < inputs.size() ? inputs[i] : kEmpty;
}

std::string Node::describe() const {
  return op_type + " '" + (name.empty() ? (outputs.empty() ? std::string("?") : outputs[0]) : name) + "'";
}

const Tensor* Graph::initializer(const std::string& v) const {
  auto it = initializers.find(v);
  return it == initializers.end() ? nullptr : &it->second;
}

int Graph::producer(const std::string& v) const {
  if (v.empty()) return -1;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs)
      if (o == v) return static_cast<int>(i);
  return -1;
}

std::vector<int> Graph::consumers(const std::string& v) const {
  std::vector<int> out;
  if (v.empty()) return out;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (std::find(nodes[i].inputs.begin(), nodes[i].inputs.end(), v) != nodes[i].inputs.end())
      out.push_back(static_cast<int>(i));
  return out;
}

bool Graph::is_graph_output(const std::string& v) const {
  return std::any_of(outputs.begin(), outputs.end(), [&](const ValueInfo& o) { return o.name == v; });
}

const ValueInfo* Graph::find_value_info(const std::string& v) const {
  for (const auto& i : inputs)
    if (i.name == v) return &i;
  for (const auto& o : outputs)
    if (o.name == v) return &o;
  auto it = value_info.find(v);
  return it == value_info.end() ? nullptr : &it->second;
}

void Graph::validate() const {
  std::unordered_set<std::string> defined;
  for (const auto& i : inputs) defined.insert(i.name);
  for (const auto& [k, t] : initializers) defined.insert(k);
  // Each value has one definition (ONNX's single static assignment): a second writer would make
  // which value readers get depend on node order.
  std::unordered_map<std::string, const Node*> writer;
  for (const auto& n : nodes)
    for (const auto& o : n.outputs) {
      if (o.empty()) continue;
      if (const auto [it, first] = writer.emplace(o, &n); !first)
        fail(ErrorKind::kInvalidModel, "value '" + o + "' is written by two nodes, " + it->second->describe() +
                                           " and " + n.describe());
      if (defined.count(o))
        fail(ErrorKind::kInvalidModel, n.describe() + " writes '" + o + "', which is already a graph input or initializer");
    }
  for (const auto& n : nodes) {
    for (const auto& in : n.inputs)
      if (!in.empty() && !defined.count(in))
        fail(ErrorKind::kInvalidModel, n.describe() + " reads '" + in +
                                           "', which no earlier node, graph input or initializer defines");
    for (const auto& o : n.outputs)
      if (!o.empty()) defined.insert(o);
  }
  for (const auto& o : outputs)
    if (!defined.count(o.name))
      fail(ErrorKind::kInvalidModel, "graph output '" + o.name + "' is never produced");
}

void Graph::topological_sort() {
  std::unordered_map<std::string, int> producer_of;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs)
      if (!o.empty())
        if (const auto [it, first] = producer_of.emplace(o, static_cast<int>(i)); !first)
          fail(ErrorKind::kInvalidModel, "value '" + o + "' is written by two nodes, " +
                                             nodes[it->second].describe() + " and " + nodes[i].describe());
  std::vector<int> state(nodes.size(), 0);  // 0 new, 1 visiting, 2 done
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  // Iterative DFS keeps deep graphs from overflowing the stack.
  for (size_t root = 0; root < nodes.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<int, size_t>> stack{{static_cast<int>(root), 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next_input] = stack.back();
      if (next_input < nodes[n].inputs.size()) {
        const std::string& in = nodes[n].inputs[next_input++];
        auto it = producer_of.find(in);
        if (it == producer_of.end()) continue;
        int p = it->second;
        if (state[p] == 1) fail(ErrorKind::kInvalidModel, "graph has a cycle through " + nodes[p].describe());
        if (state[p] == 0) {
          state[p] = 1;
          stack.push_back({p, 0});
        }
      } else {
        state[n] = 2;
        sorted.push_back(std::move(nodes[n]));
        stack.pop_back();
      }
    }
  }
  nodes = std::move(sorted);
}

void Graph::remove_unused_initializers() {
  std::unordered_set<std::string> used;
  for (const auto& n : nodes)
    for (const auto& in : n.inputs) used.insert(in);
  for (const auto& o : outputs) used.insert(o.name);
  for (auto it = initializers.begin(); it != initializers.end();)
    it = used.count(it->first) ? std::next(it) : initializers.erase(it);
}

void Graph::remove_dead_nodes(const std::set<std::string>& keep) {
  std::unordered_set<std::string> needed(keep.begin(), keep.end());
  for (const auto& o : outputs) needed.insert(o.name);
  std::vector<bool> alive(nodes.size(), false);
  for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i) {
    bool live = std::any_of(nodes[i].outputs.begin(), nodes[i].outputs.end(),
                            [&](const std::string& o) { return needed.count(o) != 0; });
    if (!live) continue;
    alive[i] = true;
    for (const auto& in : nodes[i].inputs) needed.insert(in);
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (alive[i]) kept.push_back(std::move(nodes[i]));
  nodes = std::move(kept);
  remove_unused_initializers();
}

std::string Graph::unique_value_name(const std::string& base) const { return ValueNames(*this).fresh(base); }

ValueNames::ValueNames(const Graph& g) {
  for (const auto& n : g.nodes) {
    used_.insert(n.inputs.begin(), n.inputs.end());
    used_.insert(n.outputs.begin(), n.outputs.end());
  }
  for (const auto& [k, t] : g.initializers) used_.insert(k);
  for (const auto& i : g.inputs) used_.insert(i.name);
  // Passes that add nodes only after naming their outputs reserve the names as value_info.
  for (const auto& [k, v] : g.value_info) used_.insert(k);
}

void ValueNames::reserve(const Graph& graph) {
  const std::set<std::string> names = defined_names(graph);
  used_.insert(names.begin(), names.end());
  for (const auto& n : graph.nodes) used_.insert(n.inputs.begin(), n.inputs.end());
}

std::vector<size_t> captured_reads(const Node& node, const Graph& body) {
  std::set<std::string> defined, read;
  for (const auto& n : body.nodes) {
    defined.insert(n.outputs.begin(), n.outputs.end());
    read.insert(n.inputs.begin(), n.inputs.end());
  }
  for (const auto& in : body.inputs) defined.insert(in.name);
  for (const auto& o : body.outputs) read.insert(o.name);
  std::vector<size_t> out;
  for (size_t k = 0; k < node.captured.size(); ++k) {
    const std::string& name = node.captured[k];
    if (read.count(name) && !defined.count(name) && !body.is_initializer(name)) out.push_back(k);
  }
  return out;
}

Graph standalone_subgraph(const Node& node, const std::string& attr, std::vector<size_t>& captured_inputs) {
  const Graph* sub = node.attr_graph(attr);
  SQ_CHECK(sub != nullptr, ErrorKind::kInvalidModel, node.describe() + ": missing subgraph attribute '" + attr + "'");
  Graph g = *sub;
  captured_inputs = captured_reads(node, g);
  for (size_t k : captured_inputs) g.inputs.push_back({node.captured[k], DType::kUndefined, std::nullopt});
  return g;
}

void for_each_node(const Graph& g, const std::function<void(const Node&)>& visit) {
  for (const auto& n : g.nodes) visit(n);
  for (const auto& n : g.nodes)
    for (const auto& [key, value] : n.attrs)
      if (const auto* sub = std::get_if<std::shared_ptr<const Graph>>(&value)) for_each_node(**sub, visit);
}

std::set<std::string> defined_names(const Graph& g) {
  std::set<std::string> names;
  for (const auto& n : g.nodes) {
    names.insert(n.outputs.begin(), n.outputs.end());
    for (const auto& [key, value] : n.attrs)
      if (const auto* sub = std::get_if<std::shared_ptr<const Graph>>(&value)) {
        const std::set<std::string> inner = defined_names(**sub);
        names.insert(inner.begin(), inner.end());
      }
  }
  for (const auto& [name, t] : g.initializers) names.insert(name);
  for (const auto& in : g.inputs) names.insert(in.name);
  names.erase("");
  return names;
}

void rename_values(Graph& g, const std::map<std::string, std::string>& renames) {
  if (renames.empty()) return;
  auto rename = [&](std::string& name) {
    if (const auto it = renames.find(name); it != renames.end()) name = it->second;
  };
  for (auto& n : g.nodes) {
    for (auto& v : n.inputs) rename(v);
    for (auto& v : n.outputs) rename(v);
    for (auto& v : n.captured) rename(v);
    for (auto& [key, value] : n.attrs)
      if (auto* sub = std::get_if<std::shared_ptr<const Graph>>(&value)) {
        auto copy = std::make_shared<Graph>(**sub);
        rename_values(*copy, renames);
        value = std::shared_ptr<const Graph>(std::move(copy));
      }
  }
  std::map<std::string, Tensor> initializers;
  for (auto& [name, t] : g.initializers) {
    std::string now = name;
    rename(now);
    initializers.emplace(now, std::move(t));
  }
  g.initializers = std::move(initializers);
  for (auto& v : g.inputs) rename(v.name);
  for (auto& v : g.outputs) rename(v.name);
  std::map<std::string, ValueInfo> value_info;
  for (auto& [name, info] : g.value_info) {
    ValueInfo moved = info;
    rename(moved.name);
    value_info.emplace(moved.name, std::move(moved));
  }
  g.value_info = std::move(value_info);
  auto rename_keys = [&](auto& keyed) {
    std::decay_t<decltype(keyed)> out;
    for (const auto& entry : keyed) {
      if constexpr (requires { entry.first; }) {
        std::string now = entry.first;
        rename(now);
        out.emplace(now, entry.second);
      } else {
        std::string now = entry;
        rename(now);
        out.insert(now);
      }
    }
    keyed = std::move(out);
  };
  rename_keys(g.stored_float_types);
  rename_keys(g.stored_4bit_types);
  rename_keys(g.optional_values);
  rename_keys(g.sequence_values);
}

std::string ValueNames::fresh(const std::string& base) {
  std::string name = base;
  for (int i = 1; used_.count(name); ++i) name = base + "_" + std::to_string(i);
  used_.insert(name);
  return name;
}

int64_t Graph::parameter_count() const {
  int64_t n = 0;
  for (const auto& [k, t] : initializers)
    if (t.dtype() == DType::kFloat32 || t.dtype() == DType::kInt8 || t.dtype() == DType::kUInt8 ||
        t.dtype() == DType::kFloat64)
      n += t.numel();
  return n;
}

size_t Graph::parameter_bytes() const {
  size_t n = 0;
  for (const auto& [k, t] : initializers) n += t.nbytes();
  return n;
}

}  // namespace slimquant::ir
