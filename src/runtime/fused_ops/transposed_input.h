#pragma once
// The execution-only record of a Transpose folded into its reader (Fold::kTransposedInput,
// fusions/declared_folds.cpp): the reader takes the Transpose's input at that position and the
// permutation as the attribute below; its kernel reads the input through the permutation (a
// strided view, or one copy where its primitive cannot take the view).
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

}  // namespace slimquant::runtime::fused_ops
