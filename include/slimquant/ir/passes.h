#pragma once
// Graph passes: free functions that rewrite a Graph in place and keep graph input/output names.
// Passes that must evaluate ops (constant folding) live in runtime/optimize.h.
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "slimquant/ir/graph.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::ir {

// Gives every node a unique name: an unnamed node, or one whose name an earlier node has, is named
// after its first output or its name, made unique among the graph's values. The layer names the
// PTQ reports and the QAT analysis matches them by.
void name_nodes(Graph& g);

// Moves the nodes that compute shapes (Shape, Size, and cheap integer ops on their results and
// constants: Gather, Concat, Unsqueeze, Cast, ...) to right after the values they read, keeping
// every other node's order. Exporters place them just before their one reader (a Resize at the
// end of a U-Net reads a size taken from the input): a run paused in between (the streamed layer
// sweep) then waits for them to the end, holding everything a later layer's model reads. Returns
// the nodes that moved.
int hoist_shape_computations(Graph& g);
// Reorders the nodes so that each node with early[i] set runs as soon as the values it reads
// exist; the other nodes keep their order. Returns the nodes whose place changed (0 for a graph
// with a cycle, which is left as it is).
int schedule_early(Graph& g, const std::vector<bool>& early);

// Constant nodes become initializers (value, value_float(s), value_int(s) attributes).
int constants_to_initializers(Graph& g);

// Mul by a rank-0 float constant 1 (paddle2onnx writes swish as x * Sigmoid(x * 1)) becomes an
// Identity, which remove_identity_ops then drops: exact (also for NaN, inf and -0). The other
// operand must be an activation of type float. Returns nodes replaced.
int neutral_elementwise_to_identity(Graph& g);

// Removes Identity and inference-mode Dropout nodes, rewiring their readers. Returns nodes removed.
int remove_identity_ops(Graph& g);

// Folds BatchNormalization into a preceding Conv or ConvTranspose whose output only the BN reads and
// whose weight, bias and the BN parameters are constants. Returns BN nodes removed.
int fold_batchnorm_into_conv(Graph& g);

// Folds Mul / Add / Sub / Div by a constant into a preceding Conv or ConvTranspose whose output only
// that node reads and whose weight and bias are float32 constants: conv * k, conv / k (k != 0) scale the weights
// and bias per output channel (any sign), conv + k and conv - k shift the bias. k is a scalar or
// one value per output channel broadcast along the channel axis ([C,1,1], [1,C,1,1]). Chains
// (PPLCNetV3's learnable affine blocks: Mul then Add) fold repeatedly. Returns nodes removed.
int fold_affine_into_conv(Graph& g);

// The erf GELU that PyTorch exports before opset 20, read from value y:
//   Mul(Mul(y, Add(Erf(Div(y, sqrt 2)), 1)), 0.5)
// Returns the pattern's node indices (the last one writes the result) and sets `out` to its
// result, or returns {} when the graph differs or an intermediate is kept (in `keep`, a graph
// output) or read elsewhere.
std::vector<int> match_erf_gelu(const Graph& g, const std::string& y, const std::set<std::string>& keep,
                                std::string& out);
// The same on an index (a rule's Rewriter: nodes removed earlier in the sweep do not count).
std::vector<int> match_erf_gelu(const GraphIndex& ix, const std::string& y, std::string& out);

// Hard-swish as exporters write it before opset 14 becomes one HardSwish node at the place of the
// pattern's last node: Mul(x, HardSigmoid(x; alpha 1/6, beta 0.5)) (PyTorch), when the
// HardSigmoid's output is read by that Mul only, and Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)
// (paddle2onnx; or a Mul by 1/6), when each intermediate has one reader; accept(x, v) must hold
// for every intermediate v. The result needs opset 14 to export: for execution, or where the
// HardSwish is absorbed further. Returns merges.
int merge_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept);
// paddle2onnx's Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) in the standard opset-13 spelling
// Mul(x, HardSigmoid(x; 1/6, 0.5)) (exportable ONNX, one form for the INT8 selector to recognise),
// under the same conditions as merge_hardswish. Returns rewrites.
int spell_hardswish_as_gate(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept);

// Mul(x, Sigmoid(x)), SiLU / swish as every exporter writes it (YOLO, EfficientNet, PP-YOLOE),
// becomes one com.slimquant Swish node (alpha 1: x * sigmoid(x)) at the Mul's place, when the
// Sigmoid's output is read by that Mul only and accept(x, sigmoid output) holds. Execution only:
// the activation fusion and the INT8 lowering put it into the producing Conv / Gemm. Returns merges.
int merge_swish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept);
// LayerNorm as paddle2onnx (and older PyTorch exports) write it over the last axis:
//   d = Sub(x, ReduceMean(x)); Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))) * scale [+ bias]
// becomes one LayerNormalization (axis -1, epsilon eps) at the last node's place, when every
// intermediate is read inside the pattern only and is not in `keep`; scale and bias are 1-D
// float constants. Execution only (LayerNormalization needs opset 17 to export). Returns merges.
int merge_layernorm(Graph& g, const std::set<std::string>& keep = {});

// Add(x, Mul(x, gate)), a gated map added back to the map (the residual squeeze-excitation of
// PP-OCRv4 det's RSE-FPN: x + x * HardSigmoid(...)), becomes Mul(x, Add(gate, 1)) at the Add's
// place when the gate is float32 and the product is read by that Add only and not in `keep`: the
// + 1 runs on the gate (one value per channel there) and the full-size map is read once and
// written once instead of twice each. Equal up to float rounding. Execution only. Returns merges.
int merge_residual_gate(Graph& g, const std::set<std::string>& keep = {});

// The model passes as ordered rule lists (runtime::optimize_graph runs them around constant
// folding). Each pass above is one selector + action rule of the same name; the functions above run
// their rule alone. Clean-up after import: constants_to_initializers, neutral_elementwise_to_identity,
// remove_identity_ops, dequantize_lstm_weights (ONNX Runtime's com.microsoft DynamicQuantizeLSTM
// with constant codes -> LSTM on its dequantized weights).
std::vector<Rule> cleanup_rules();
// fold_batchnorm_into_conv, fold_affine_into_conv: run until neither fires (a BatchNorm can follow
// an Add that folds first).
std::vector<Rule> conv_folding_rules();
// The execution-only merges, in the order the session runs them: merge_decomposed_hardswish
// (paddle2onnx's Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)) and merge_hardswish (x * HardSigmoid(x)),
// the two halves of merge_hardswish(), then merge_swish, merge_layernorm, merge_residual_gate. The
// run's keep set stands in for the accept predicates (no kept intermediate is merged away).
std::vector<Rule> execution_merge_rules();

// MatMul(a, W) [-> Add(bias)] whose result only Slices of its last axis read (constant bounds,
// step 1, no more columns in all than W has) becomes one MatMul [+ Add] per Slice on W's (and the
// bias's) columns: PyTorch's packed q / k / v projection, cut in three after it. The copies go and
// each part's result is what its readers see, so each can end in its own quantization or layout.
// W is a float constant [K, N] or DequantizeLinear of constant 8-bit codes, per tensor or per
// column. The same arithmetic per column; for execution (the names of the split nodes change).
Rule split_matmul_by_column_slices_rule();

// Sets the shapes of the given graph inputs (others keep their declared shapes), forgets inferred
// intermediate shapes and re-infers all shapes with ONNX shape inference. Throws kInvalidArgument
// for unknown input names or a rank/dimension that contradicts the model's declaration.
void bind_input_shapes(Graph& g, const std::map<std::string, Shape>& shapes);

}  // namespace slimquant::ir
