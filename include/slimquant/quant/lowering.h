#pragma once
// INT8 lowering: the integer execution of a QDQ graph (the float simulation is the same graph run
// as is). Lowering is selection + action, like ONNX Runtime's QDQ transformers: a selector
// recognises a node group
//     DQ(x_q) , DQ(w_q) [, bias] -> Conv | Gemm | MatMul [-> Add(constant bias)] [-> Relu | Clip] [-> Q]
// (w_q a constant int8 weight, or for MatMul also a run-time s8 activation)
// and validates it once into a QdqGroup; an action replaces the group by one fused node of domain
// "com.slimquant" (QConv, QGemm, QMatMul) that reads x_q and w_q directly and writes y_q (or float32
// when the group has no trailing Q). Quantized tensors therefore flow from one fused node to the
// next with no float round trip; QuantizeLinear stays only where float values feed quantized ops,
// DequantizeLinear only where quantized values feed float ops. Anything not matched keeps running
// as float simulation, so every QDQ model runs. docs/int8_execution.md has the arithmetic.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/core/quant_param.h"
#include "slimquant/ir/graph.h"
#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

enum class LoweredOp { kConv, kGemm, kMatMul };
const char* lowered_op_type(LoweredOp op);  // "QConv", "QGemm", "QMatMul"
struct LoweringOptions;
struct LoweringReport;

// One group the selector recognised, already validated. Node indices refer to the graph given to
// the selector (they stay valid until that graph's node list changes).
struct QdqGroup {
  LoweredOp op = LoweredOp::kConv;
  std::vector<int> dq_inputs;  // DequantizeLinear nodes the target reads: x's, w's (and a quantized bias's)
  int target = -1;             // the Conv / Gemm / MatMul
  int bias_add = -1;           // MatMul -> Add(constant [N]) taken in as the bias, or -1
  int scale_mul = -1;          // MatMul -> Mul(positive scalar constant) folded into the output scale, or -1
  float output_factor = 1.f;   // that scalar
  int activation = -1;         // Relu / Clip / ... taken in (the Mul of a gated one), or -1
  int gate = -1;               // the Sigmoid / HardSigmoid of x * gate(x) (swish, hard-swish), or -1
  std::vector<int> gelu_chain; // or the nodes of an erf GELU taken in as the activation
  int post_mul = -1, post_add = -1;  // Mul / Add by a scalar constant after a real-units activation
  float post_scale = 1.f, post_shift = 0.f;  // their combined act(v) * post_scale + post_shift
  int q_output = -1;           // the QuantizeLinear ending the group, or -1 (float32 output)
  std::string x_q, w_q;        // the integer values the fused node reads
  std::string output;          // the value it writes: Q's output, or the last float value of the group
  QuantParam x, w, y;          // as read_qdq_params gives them; y is empty (no scale) for a float32 output
  bool quantized_bias = false; // the bias is DequantizeLinear(int32 constant): the action makes it float
  bool runtime_weight = false; // MatMul of two activations: w_q is a run-time s8 tensor (per tensor)
};

// Why a candidate (a Conv/Gemm/MatMul reading a DequantizeLinear) was left in simulation.
struct LoweringSkip {
  std::string node;    // node name
  std::string reason;  // "cannot lower Conv 'x': weight zero point must be 0 for s8 weights (got 3)"
};

struct LoweringOptions {
  bool conv = true, gemm = true, matmul = true;  // which op families to lower
  bool fuse_activation = true;       // take a Relu / Clip that alone reads the output into the group
  bool fuse_output_quantize = true;  // end the group in its QuantizeLinear (integer output)
  bool fuse_matmul_bias = true;      // take MatMul -> Add(constant [N]) as the bias
  bool activation_matmul = true;     // lower MatMul of two activations (attention) when B is s8, zero point 0
  // How fused nodes accumulate (written on each node, see runtime/kernels/integer/int8_common.h): "auto"
  // (exact int8 dot products where the CPU has them, the exact float path otherwise), "int8", "f32".
  std::string compute = "auto";
};

// One lowered integer family, as one entry of lowered_families(): the selector, the action and the
// report read everything family-specific from here (docs/rewrites.md: adding a family).
struct LoweredFamily {
  LoweredOp op;
  const char* float_op;  // the ONNX op it replaces ("Conv")
  const char* fused_op;  // the com.slimquant op the integer kernels run ("QConv")
  bool LoweringOptions::*enabled;  // the option that turns it on
  int LoweringReport::*lowered;    // its counter in the report
  // The weight's output-channel axis, or -1 when its kernel does not take that weight layout.
  int64_t (*weight_channel_axis)(const ir::Node& target, const Tensor& w);
  // Family-specific attribute checks (nullptr: none); returns why the node cannot be lowered.
  std::optional<std::string> (*check_attributes)(const ir::Node& target);
  bool bias_input;      // input 2 is a per-output-channel bias (Conv's B, Gemm's C)
  bool runtime_weight;  // input 1 may be an s8 activation instead of a constant weight
  bool matmul_tail;     // takes Mul(scalar) and Add(constant bias) after the product into the group
};
const std::vector<LoweredFamily>& lowered_families();
// The family lowering `n` (an ONNX Conv / Gemm / MatMul), or nullptr.
const LoweredFamily* find_lowered_family(const ir::Node& n);
const LoweredFamily& lowered_family(LoweredOp op);

// The one definition of a quantized layer in a QDQ graph: a node that reads at least one (ONNX)
// DequantizeLinear output. The selector's candidates are the nodes of the families' ops that match;
// QAT analysis (analysis::find_quantized_layers) finds its layers, of its own wider op types, with
// the same match.
struct QuantizedLayerMatch {
  std::vector<int> dequantize;  // the DequantizeLinear nodes it reads, in input order
  // The float activations quantized for it: the input of each QuantizeLinear feeding one of those
  // DequantizeLinear nodes, when it is not a constant (in input order).
  std::vector<std::string> activations;
};
std::optional<QuantizedLayerMatch> match_quantized_layer(const ir::GraphIndex& ix, int node);

// Selector: the groups lower_to_int8 replaces, in node order. Scales, zero points, weights and
// biases must be initializers (run runtime::optimize_graph first; lower_to_int8 does). When
// `skipped` is given it receives one entry per candidate that was not lowered, with the reason.
std::vector<QdqGroup> select_qdq_groups(const ir::Graph& g, const LoweringOptions& options = {},
                                        std::vector<LoweringSkip>* skipped = nullptr);

// Action: the fused node replacing `group` (adds a float bias initializer to g when the group's
// bias is quantized).
ir::Node make_fused_node(ir::Graph& g, const QdqGroup& group, const LoweringOptions& options = {});

struct LoweringReport {
  int conv = 0, gemm = 0, matmul = 0;  // groups lowered per family
  int quantize_kept = 0, dequantize_kept = 0;  // Q / DQ nodes left (float <-> integer boundaries)
  std::vector<LoweringSkip> skipped;
  int lowered() const { return conv + gemm + matmul; }
};

// The integer form of a QDQ graph (constants folded, groups replaced, Q/DQ nodes nobody reads any
// more removed). A graph with no QDQ group comes back optimised but otherwise unchanged.
ir::Graph lower_to_int8(const ir::Graph& qdq, const LoweringOptions& options = {}, LoweringReport* report = nullptr);

// True when the graph has QuantizeLinear or DequantizeLinear nodes.
bool has_qdq_nodes(const ir::Graph& g);

// lower_to_int8 + Session.
runtime::Session make_int8_session(const ir::Graph& qdq, runtime::SessionOptions options = {},
                                   const LoweringOptions& lowering = {});

}  // namespace slimquant::quant
