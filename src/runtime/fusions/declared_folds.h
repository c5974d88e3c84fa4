#pragma once
// The generic fold rules: a producer read through an input prologue, or a chain of consumers
// applied as output epilogues, folds into any node whose kernel declares it accepts that fold
// (KernelFolds, include/slimquant/runtime/kernel.h). Each Fold kind is written once here: what
// the producer or consumer looks like and the execution-only attributes that record it on the
// node; the kernels read those attributes.
#include <initializer_list>
#include <string>

#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {

// Anchored at a node whose kernel declares one of `epilogues` (kActivation, kPostAffine,
// kTensorQuantize, kChannelQuantize): folds the chain of sole readers after its output that match
// those kinds, in their stage order, until one does not.
ir::Rule epilogue_fold_rule(std::string name, std::initializer_list<Fold> epilogues);

// Anchored at a producer of `prologue`'s form (kDequantizedInput: a per-tensor u8/s8
// DequantizeLinear; kScaledInput: x * s; kUpsampledInput: a nearest integer-factor Resize;
// kTransposedInput: a Transpose with an explicit perm): folds
// it into all its readers when every one of them accepts it at every input that reads it.
ir::Rule prologue_fold_rule(std::string name, Fold prologue);

}  // namespace slimquant::runtime
