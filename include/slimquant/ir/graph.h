#pragma once
// Graph IR: ONNX-shaped (values are referred to by name), so that passes and the QDQ editing done
// by quantization and analysis read like the ONNX they produce. Nodes are kept in topological order.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant::ir {

struct Graph;

// A Cast to float16/bfloat16 is held as a Cast to float32 carrying this attribute (the ONNX type
// id): the kernel rounds through that type, and save_onnx writes the Cast pair back.
inline constexpr const char* kCastRoundsToAttr = "slimquant.rounds_to";
// GRAPH attributes (If's branches) are held by shared pointer: copies of a node share the branch.
using AttributeValue = std::variant<int64_t, float, std::string, Tensor, std::vector<int64_t>,
                                    std::vector<float>, std::vector<std::string>, std::shared_ptr<const Graph>>;

// A dimension is either known (>= 0) or symbolic (param name, may be empty).
struct Dim {
  int64_t value = -1;
  std::string param;
  bool known() const { return value >= 0; }
};

struct ValueInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  std::optional<std::vector<Dim>> dims;  // nullopt: rank unknown
  bool fully_known() const;
  Shape shape() const;  // requires fully_known()
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;               // "" = default ONNX domain
  std::vector<std::string> inputs;  // "" = optional input left out
  std::vector<std::string> outputs;
  std::map<std::string, AttributeValue> attrs;
  // Outer-scope values the node's subgraphs read, as the subgraphs name them. They are also the
  // last captured.size() entries of `inputs` (under their current outer names, which passes may
  // rename), so that ordering, liveness and folding see the dependency; export drops them again.
  std::vector<std::string> captured;

  bool has_attr(const std::string& k) const { return attrs.count(k) != 0; }
  int64_t attr_int(const std::string& k, int64_t def) const;
  float attr_float(const std::string& k, float def) const;
  std::string attr_string(const std::string& k, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& k, std::vector<int64_t> def = {}) const;
  std::vector<float> attr_floats(const std::string& k, std::vector<float> def = {}) const;
  const Tensor* attr_tensor(const std::string& k) const;
  const Graph* attr_graph(const std::string& k) const;  // a GRAPH attribute, or nullptr
  size_t declared_inputs() const { return inputs.size() - captured.size(); }
  // Input i if present (non-empty name), else empty string.
  const std::string& input(size_t i) const;
  // "Conv 'layer1.conv'" for error messages.
  std::string describe() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::map<std::string, Tensor> initializers;
  std::vector<ValueInfo> inputs;   // graph inputs that are not initializers
  std::vector<ValueInfo> outputs;
  std::map<std::string, ValueInfo> value_info;  // inferred/declared types of intermediates
  // Model-level metadata preserved on export.
  int64_t opset = 13;
  std::map<std::string, int64_t> extra_opsets;  // other domains
  int64_t ir_version = 8;
  std::string producer_name, producer_version, doc_string;
  std::map<std::string, std::string> metadata;
  // Values the file stores as FLOAT16 or BFLOAT16 (ONNX type id): initializers, graph inputs and
  // outputs. They are float32 here; save_onnx writes them back in that type (an initializer plus a
  // Cast, an input followed by a Cast to float, an output preceded by a Cast), so an export keeps
  // the model's interface and a weight left in float keeps its size.
  std::map<std::string, int> stored_float_types;
  // Initializers the file stores as 4-bit integers (ONNX INT4 = 22, UINT4 = 21; packed two a byte,
  // low nibble first): held unpacked here as int8 / uint8, written back packed by save_onnx.
  std::map<std::string, int> stored_4bit_types;
  // Inputs and outputs declared optional(...) (If branches of scripted exports): a value that may
  // hold nothing, held as an undefined Tensor when empty.
  std::set<std::string> optional_values;
  // Inputs and outputs declared seq(tensor) (or optional(seq(tensor)), also in optional_values):
  // their ValueInfo's dtype is the element type, their dims unknown; at run time the value is a
  // Tensor::sequence. Maps stay unsupported.
  std::set<std::string> sequence_values;

  bool is_initializer(const std::string& v) const { return initializers.count(v) != 0; }
  const Tensor* initializer(const std::string& v) const;
  // Index of the node producing value v, or -1 (graph input / initializer / unknown).
  int producer(const std::string& v) const;
  // Indices of nodes reading value v.
  std::vector<int> consumers(const std::string& v) const;
  bool is_graph_output(const std::string& v) const;
  const ValueInfo* find_value_info(const std::string& v) const;  // inputs, outputs, value_info
  // Throws kInvalidModel if a node reads a value nothing defines, or the order is not topological.
  void validate() const;
  // Reorders nodes topologically (stable); throws on cycles.
  void topological_sort();
  // Removes initializers no node or output reads.
  void remove_unused_initializers();
  // Removes nodes whose outputs are not needed for the graph outputs.
  // keep: values that stay needed besides the graph outputs (a session's requested values).
  void remove_dead_nodes(const std::set<std::string>& keep = {});
  // A value name not used yet in the graph (nodes, initializers, inputs, value_info), derived from base.
  std::string unique_value_name(const std::string& base) const;
  // Parameter count and bytes of float/int initializers.
  int64_t parameter_count() const;
  size_t parameter_bytes() const;
};

// Fresh value names for a pass that adds many values: the graph's names are collected once, where
// Graph::unique_value_name collects them on every call.
class ValueNames {
 public:
  explicit ValueNames(const Graph& graph);
  // `base` when unused, else base_1, base_2, ...; reserved from then on.
  std::string fresh(const std::string& base);
  // Reserves the names another graph uses (a subgraph's, whose names must not shadow these).
  void reserve(const Graph& graph);

 private:
  std::set<std::string> used_;
};

// A subgraph of `node` (attribute `attr`, an If branch) as a graph of its own: the outer values it
// reads become inputs after its own, under the names the body reads them by. `captured_inputs`
// gets, per added input, its index in node.captured (the outer value is
// node.inputs[node.declared_inputs() + index]). Their types are unknown (kUndefined).
Graph standalone_subgraph(const Node& node, const std::string& attr, std::vector<size_t>& captured_inputs);
// The indices into node.captured of the outer values its subgraph `body` reads (and does not
// define itself): the inputs standalone_subgraph adds, without copying the body.
std::vector<size_t> captured_reads(const Node& node, const Graph& body);

// Calls visit on every node of g and of its subgraphs (recursively), outer nodes first.
void for_each_node(const Graph& g, const std::function<void(const Node&)>& visit);

// The names a graph defines (node outputs, initializers, inputs), those of its subgraphs included.
std::set<std::string> defined_names(const Graph& g);

// Every occurrence of each key of `renames` in g and its subgraphs (definitions, reads, captured
// lists, outputs, declared types) under its new name. Names are unique across scopes (ONNX's
// single static assignment), so a name means the same value wherever it occurs.
void rename_values(Graph& g, const std::map<std::string, std::string>& renames);

}  // namespace slimquant::ir
