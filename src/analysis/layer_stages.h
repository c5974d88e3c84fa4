#pragma once
// A layer's model in the streamed sweep runs in stages: whatever part of it the values at hand
// already allow, then the rest when its last input arrives.
//
// A layer's model reads the base run's values at its boundary (boundary_values). Some of them may
// come much later than the others: on a U-Net whose side outputs are computed after the last
// decoder, every decoder layer's model also reads the other decoders' side maps, so it waited for
// the base run's end while holding its full-resolution inputs (550 MB of held values at 512x512,
// more than one whole FP32 inference). A stage runs the nodes those early inputs already allow and
// keeps only what the remaining nodes read (here a one-channel side map), so the inputs go.
//
// Graph bookkeeping only: the caller runs each stage (Session::run with the stage's inputs and
// outputs) and holds the values. Stages never repeat a node, so a staged run computes what the
// whole run would, split at values the plan cannot fuse across (float rounding may differ there).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"

namespace slimquant::analysis {

class LayerStages {
 public:
  // `feeds`: the values fed to the model (boundary values); `output`: the value to compute.
  LayerStages(const ir::Graph& model, const std::vector<std::string>& feeds, const std::string& output);

  struct Stage {
    std::vector<std::string> inputs;    // fed values and earlier stages' outputs the stage reads
    std::vector<std::string> outputs;   // what later stages read (the final stage: the output)
    std::vector<std::string> released;  // held values no later stage reads
    bool final = false;                 // runs every node left
    std::vector<bool> runs;             // per node the output needs: whether this stage runs it
  };
  // The next stage given the values at hand (`available`: an arrived feed or an earlier stage's
  // output), or nothing when no node left can run yet. Does not change the state.
  std::optional<Stage> next(const std::function<bool(const std::string&)>& available) const;
  // Marks the nodes of `stage` (as next returned it) as computed.
  void commit(const Stage& stage);
  // Back to no node computed (a new batch).
  void reset();
  bool started() const;

 private:
  // The nodes left that can run from `available` (and each other), in graph order.
  std::vector<bool> runnable(const std::function<bool(const std::string&)>& available) const;

  const ir::Graph& model_;
  std::string output_;
  std::vector<int> needed_;      // nodes the output depends on past the feeds, in graph order
  std::vector<bool> computed_;   // per entry of needed_
};

}  // namespace slimquant::analysis
