#pragma once
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::ir {

// Loads an ONNX model file (external data resolved relative to the file). Throws kIo for a
// missing file and kInvalidModel, naming the file, for anything that does not parse as ONNX.
Graph load_onnx(const std::string& path);
// The inputs a model file declares (its initializers left out), read without the checks, shape
// inference and external data of load_onnx: for a command that needs only them before loading.
// None when the file does not parse (loading it then says why).
std::vector<ValueInfo> read_model_inputs(const std::string& path);
// Parses serialized ModelProto bytes; base_dir resolves external data.
Graph parse_onnx(const std::string& bytes, const std::string& base_dir, const std::string& what);

// Writes the graph as an ONNX model; runs onnx::checker first (kInternal on failure). Writes to a
// temporary file and renames it, so a failed write never leaves a half-written model behind.
void save_onnx(const Graph& graph, const std::string& path);
std::string serialize_onnx(const Graph& graph);
// onnx::checker on the serialized model; throws kInvalidModel with the checker's message.
void check_onnx(const Graph& graph);

// Runs ONNX's shape inference and stores what it finds in graph.value_info. Checks the nodes'
// attributes first (check_node_attributes).
void infer_shapes_onnx(Graph& graph);

// Checks each node's attributes, in subgraphs too, against ONNX's schema for the model's opset
// (types, required attributes) and the ranges ONNX's shape inference and the kernels compute with
// (strides, dilations and windows >= 1, pads >= 0 and one per spatial axis, group >= 1, block
// sizes, scales, ...); throws kInvalidModel naming the node and the attribute. ONNX's inference
// functions trust these values: Conv strides=[0,0] is a SIGFPE inside onnx::convPoolShapeInference.
// parse_onnx calls it.
void check_node_attributes(const Graph& graph);
// Checks default-domain nodes' input and output counts against ONNX's schema, and the dtypes the
// file states (initializers, declared graph inputs) against the type constraints of the ops
// reading them (an int64 Conv bias, a float32 and an int64 input of one Add), throwing
// kInvalidModel naming node, input and allowed types. parse_onnx calls it.
void check_constant_input_types(const Graph& graph);

}  // namespace slimquant::ir

namespace slimquant::ir {
// Reads a serialized TensorProto (.pb), as in ONNX's backend test data. Returns its name too.
Tensor read_tensor_pb(const std::string& path, std::string* name = nullptr);
// The same for a serialized SequenceProto of tensors (a Tensor::sequence) and an OptionalProto of
// a tensor or a sequence (undefined when empty).
Tensor read_sequence_pb(const std::string& path, std::string* name = nullptr);
Tensor read_optional_pb(const std::string& path, std::string* name = nullptr);
}  // namespace slimquant::ir

namespace slimquant::ir {
// The source documents' model_dir/model_filename/params_filename convention: `model_dir` is an
// .onnx file, or a directory holding `model_filename` (default: its only .onnx file).
// `params_filename` names the external-data file, which ONNX already records per tensor; it is
// checked for existence when given.
Graph load_model(const std::string& model_dir, const std::string& model_filename = "",
                 const std::string& params_filename = "");
}  // namespace slimquant::ir

namespace slimquant::ir {
// Converts the graph to another default-domain opset with ONNX's version converter (e.g. to 13,
// which per-channel QuantizeLinear/DequantizeLinear need). No-op when already there.
void convert_opset(Graph& graph, int64_t target_opset);
}  // namespace slimquant::ir
