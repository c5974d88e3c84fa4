#pragma once
#include <map>
#include <set>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime {

struct FoldOptions {
  // Keep DequantizeLinear of constant weights: the QDQ structure is what INT8 lowering matches.
  bool keep_dequantize_linear = true;
  // Do not fold constants larger than this (e.g. a huge ConstantOfShape) into the model.
  size_t max_folded_bytes = size_t{64} << 20;
  // Values that stay available (as initializers) when they fold, even if nothing reads them any
  // more: a session's requested outputs, e.g. a shape value analysis feeds to a downstream run.
  std::set<std::string> keep;
};

// Evaluates nodes whose inputs are all constants (and Shape/Size of values with known shapes)
// with the runtime's own kernels, replacing them by initializers. Returns nodes folded.
int fold_constants(ir::Graph& g, const FoldOptions& options = {});

// Shape arithmetic that does not depend on the batch size but that ONNX's shape inference could not
// follow (sizes lost at a Reshape to a computed target with a dynamic batch) becomes constants:
// the nodes whose outputs batch_invariant_sizes knows are replaced by initializers, then the rest
// folds. Values in options.keep stay computed. Returns nodes replaced. (INT8 lowering runs it before
// it matches layers; a session's plan takes the sizes from its model before binding its shapes,
// since a batch size bound into the shapes is no longer a symbol the proof can follow.)
int fold_batch_invariant_sizes(ir::Graph& g, const FoldOptions& options = {});
// The same with the values given: nodes whose outputs are all in `known` are replaced by them.
int fold_known_values(ir::Graph& g, const std::map<std::string, Tensor>& known, const FoldOptions& options = {});

// The construction-time pipeline: Constant nodes -> initializers, Identity/Dropout removal,
// constant folding, BatchNorm folding, dead node removal.
void optimize_graph(ir::Graph& g, const FoldOptions& options = {});

// Throws kUnsupported naming the first node (op and name) that has no kernel.
void check_supported(const ir::Graph& graph);

}  // namespace slimquant::runtime
