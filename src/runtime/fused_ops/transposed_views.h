#pragma once
// The execution-only record of a Transpose folded into the node before or after it
// (fusions/declared_folds.cpp): Fold::kTransposedInput, the reader takes the Transpose's input at
// that position and the permutation as the attribute below, and its kernel reads the input through
// the permutation; Fold::kTransposedOutput, the producer writes its result permuted (the
// Transpose's output). Either way a strided view, or one copy where the primitive cannot take it.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime::fused_ops {

// "slimquant.transposed_input_<k>": ints, the Transpose's perm for input k.
inline std::string transposed_input_attr(size_t input) {
  return "slimquant.transposed_input_" + std::to_string(input);
}

// The permutation folded in at input k, if any.
inline std::optional<std::vector<int64_t>> transposed_input_perm(const ir::Node& n, size_t input) {
  const std::string name = transposed_input_attr(input);
  if (!n.has_attr(name)) return std::nullopt;
  return n.attr_ints(name);
}

inline constexpr const char* kTransposedOutput = "slimquant.transposed_output";  // ints: the perm

// The permutation the output is written through, if any.
inline std::optional<std::vector<int64_t>> transposed_output_perm(const ir::Node& n) {
  if (!n.has_attr(kTransposedOutput)) return std::nullopt;
  return n.attr_ints(kTransposedOutput);
}

}  // namespace slimquant::runtime::fused_ops
