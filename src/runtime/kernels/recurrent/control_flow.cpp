// If: runs one of two subgraphs, chosen by a boolean scalar at run time (torchvision's detection
// exports branch on "no boxes left" before NonMaxSuppression, ROI pooling on the level count).
// Each branch is compiled once into its own Session whose graph inputs are the outer values the
// branch reads (ir::Node::captured); the plan hands them over as the node's trailing inputs.
// Optional tensors (Optional, OptionalHasElement, OptionalGetElement: scripted exports return
// Optional[Tensor] from If branches) are tensors that may be undefined: an empty optional reaches a
// kernel as a missing input.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "runtime/kernels/register_all.h"
#include "slimquant/runtime/session.h"

namespace slimquant::runtime {
namespace {

class IfKernel final : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init)
      : node_(init.node), then_(branch("then_branch")), else_(branch("else_branch")) {}

  void run(KernelContext& ctx) override {
    const Tensor& cond = ctx.input(0);
    SQ_CHECK(cond.numel() == 1, ErrorKind::kInvalidArgument,
             node_.describe() + ": the condition must hold one element, got shape " + shape_str(cond.shape()));
    const bool take_then = cond.to_float_vector()[0] != 0.f;
    Branch& b = take_then ? then_ : else_;
    std::map<std::string, Tensor> feeds;
    const size_t first = node_.declared_inputs();
    for (size_t k = 0; k < node_.captured.size(); ++k)  // an empty optional is fed as undefined
      if (b.reads.count(node_.captured[k]))
        feeds[node_.captured[k]] = ctx.has_input(first + k) ? ctx.input(first + k) : Tensor();
    std::map<std::string, Tensor> out = b.session->run(feeds);
    const auto& names = b.session->outputs();
    SQ_CHECK(names.size() == ctx.num_outputs(), ErrorKind::kInvalidModel,
             node_.describe() + ": the " + (take_then ? "then" : "else") + " branch has " +
                 std::to_string(names.size()) + " outputs, the node " + std::to_string(ctx.num_outputs()));
    for (size_t i = 0; i < names.size(); ++i) {
      const Tensor& v = out.at(names[i].name);
      if (!v.defined()) {  // an empty optional
        ctx.set_output(i, Tensor());
        continue;
      }
      // A copy: the branch's buffers are reused by its next run.
      Tensor& y = ctx.allocate_output(i, v.dtype(), v.shape());
      if (v.nbytes() > 0) std::memcpy(y.raw(), v.raw(), v.nbytes());
    }
  }

 private:
  struct Branch {
    std::unique_ptr<Session> session;
    std::set<std::string> reads;  // the captured values this branch's session takes as inputs
  };

  Branch branch(const char* attr) const {
    const ir::Graph* g = node_.attr_graph(attr);
    if (!g) fail(ErrorKind::kInvalidModel, node_.describe() + ": missing subgraph attribute '" + attr + "'");
    ir::Graph sub = *g;
    Branch b;
    std::set<std::string> defined;
    for (const auto& n : sub.nodes) defined.insert(n.outputs.begin(), n.outputs.end());
    for (const auto& name : node_.captured) {
      bool read = false;
      for (const auto& n : sub.nodes)
        read = read || std::find(n.inputs.begin(), n.inputs.end(), name) != n.inputs.end();
      for (const auto& o : sub.outputs) read = read || o.name == name;
      if (!read || defined.count(name) || sub.is_initializer(name)) continue;
      sub.inputs.push_back({name, DType::kUndefined, std::nullopt});
      sub.optional_values.insert(name);  // the outer value may be an empty optional
      b.reads.insert(name);
    }
    SessionOptions options;
    options.max_cached_plans = 16;  // shapes of data-dependent values (box counts) vary per image
    try {
      b.session = std::make_unique<Session>(std::move(sub), options);
    } catch (const Error& e) {
      fail(e.kind(), node_.describe() + " " + attr + ": " + e.what());
    }
    return b;
  }

  const ir::Node node_;
  Branch then_, else_;
};

}  // namespace

// Optional(x): x, or an empty optional without input. OptionalGetElement(x): x, which must not be
// empty (a plain tensor is its own element). OptionalHasElement(x): whether x holds a tensor.
class OptionalKernel final : public Kernel {
 public:
  explicit OptionalKernel(const KernelInit& init) : node_(init.node) {}

  void run(KernelContext& ctx) override {
    const bool present = ctx.has_input(0) && ctx.input(0).defined();
    if (node_.op_type == "OptionalHasElement") {
      ctx.allocate_output(0, DType::kBool, {}).data<bool>()[0] = present;
    } else if (present) {
      ctx.set_output(0, ctx.input(0));
    } else {
      SQ_CHECK(node_.op_type == "Optional", ErrorKind::kInvalidArgument,
               node_.describe() + ": the optional value is empty (the model's own control flow should have "
                                  "checked it with OptionalHasElement)");
      ctx.set_output(0, Tensor());
    }
  }

 private:
  const ir::Node& node_;
};

void register_control_flow_kernels(KernelRegistry& r) {
  r.add("If", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<IfKernel>(init); });
  for (const char* op : {"Optional", "OptionalHasElement", "OptionalGetElement"})
    r.add(op, [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<OptionalKernel>(init); });
}

}  // namespace slimquant::runtime
