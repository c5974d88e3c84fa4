// Sequence ops (opset 11+): a sequence is a Tensor::sequence, an immutable list of tensor handles,
// so inserting or erasing copies handles, never element data. Positions follow ONNX: negative ones
// count from the back; out of range is an error naming the node.
#include <algorithm>
#include <numeric>

#include "runtime/kernels/recurrent/subgraph.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

const Tensor& sequence_input(const KernelContext& ctx, size_t i) {
  const Tensor& s = ctx.input(i);
  SQ_CHECK(s.is_sequence(), ErrorKind::kInvalidArgument,
           ctx.node().describe() + ": input " + std::to_string(i) + " must be a sequence, got a tensor of shape " +
               shape_str(s.shape()));
  return s;
}

// A position input read against a sequence of `size` elements; `end_allowed`: size itself is a
// valid position (insertion at the back).
size_t position(const KernelContext& ctx, size_t input, size_t size, bool end_allowed) {
  const Tensor& p = ctx.input(input);
  SQ_CHECK(p.numel() == 1 && !dtype_is_float(p.dtype()), ErrorKind::kInvalidArgument,
           ctx.node().describe() + ": the position must be one integer, got " + dtype_name(p.dtype()) + " " +
               shape_str(p.shape()));
  const int64_t n = static_cast<int64_t>(size), given = p.to_int64_vector()[0];
  const int64_t last = end_allowed ? n : n - 1;
  SQ_CHECK(given >= -n && given <= last, ErrorKind::kInvalidArgument,
           ctx.node().describe() + ": position " + std::to_string(given) + " is out of range for a sequence of " +
               std::to_string(n) + " elements (valid: " + std::to_string(-n) + " to " + std::to_string(last) + ")");
  return static_cast<size_t>(given < 0 ? given + n : given);
}

void sequence_empty(KernelContext& ctx) {
  const int64_t type = ctx.node().attr_int("dtype", static_cast<int64_t>(DType::kFloat32));
  ctx.set_output(0, Tensor::sequence(dtype_from_onnx(static_cast<int>(type)), {}));
}

void sequence_construct(KernelContext& ctx) {
  std::vector<Tensor> elements;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) elements.push_back(ctx.input(i));
  SQ_CHECK(!elements.empty(), ErrorKind::kInvalidModel, ctx.node().describe() + " has no inputs");
  const DType element_type = elements.front().dtype();
  ctx.set_output(0, Tensor::sequence(element_type, std::move(elements)));
}

void sequence_insert(KernelContext& ctx) {
  const Tensor& s = sequence_input(ctx, 0);
  std::vector<Tensor> elements = s.elements();
  const size_t at = ctx.has_input(2) ? position(ctx, 2, elements.size(), true) : elements.size();
  const Tensor& x = ctx.input(1);
  SQ_CHECK(x.dtype() == s.dtype() && !x.is_sequence(), ErrorKind::kInvalidArgument,
           ctx.node().describe() + ": cannot insert a " + dtype_name(x.dtype()) + " tensor into a sequence of " +
               dtype_name(s.dtype()));
  elements.insert(elements.begin() + static_cast<std::ptrdiff_t>(at), x);
  ctx.set_output(0, Tensor::sequence(s.dtype(), std::move(elements)));
}

void sequence_at(KernelContext& ctx) {
  const Tensor& s = sequence_input(ctx, 0);
  ctx.set_output(0, s.elements()[position(ctx, 1, s.elements().size(), false)]);
}

void sequence_erase(KernelContext& ctx) {
  const Tensor& s = sequence_input(ctx, 0);
  std::vector<Tensor> elements = s.elements();
  SQ_CHECK(!elements.empty(), ErrorKind::kInvalidArgument, ctx.node().describe() + ": the sequence is empty");
  const size_t at = ctx.has_input(1) ? position(ctx, 1, elements.size(), false) : elements.size() - 1;
  elements.erase(elements.begin() + static_cast<std::ptrdiff_t>(at));
  ctx.set_output(0, Tensor::sequence(s.dtype(), std::move(elements)));
}

void sequence_length(KernelContext& ctx) {
  const int64_t n = static_cast<int64_t>(sequence_input(ctx, 0).elements().size());
  ctx.allocate_output(0, DType::kInt64, {}).data<int64_t>()[0] = n;
}

void concat_from_sequence(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  SQ_CHECK(node.has_attr("axis"), ErrorKind::kInvalidModel, node.describe() + " needs its axis attribute");
  const int64_t axis = node.attr_int("axis", 0);
  const bool new_axis = node.attr_int("new_axis", 0) != 0;
  const std::vector<Tensor>& parts = sequence_input(ctx, 0).elements();
  const Shape shape = joined_shape(parts, axis, new_axis, node.describe());
  join_along_axis(parts, axis, new_axis, ctx.allocate_output(0, parts.front().dtype(), shape));
}

// SplitToSequence: without `split`, pieces of 1 along the axis (squeezed unless keepdims); a scalar
// `split` gives pieces of that length (the last may be shorter); a 1-D one the pieces' lengths.
void split_to_sequence(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const int64_t axis = normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.rank()), node.describe() + " axis");
  const int64_t extent = x.dim(static_cast<size_t>(axis));
  std::vector<int64_t> lengths;
  bool squeeze = false;
  if (!ctx.has_input(1)) {
    lengths.assign(static_cast<size_t>(extent), 1);
    squeeze = node.attr_int("keepdims", 1) == 0;
  } else if (const Tensor& split = ctx.input(1); split.rank() == 0) {
    const int64_t piece = split.to_int64_vector()[0];
    SQ_CHECK(piece > 0, ErrorKind::kInvalidArgument, node.describe() + ": split must be positive, got " + std::to_string(piece));
    for (int64_t at = 0; at < extent; at += piece) lengths.push_back(std::min(piece, extent - at));
  } else {
    lengths = split.to_int64_vector();
    const bool valid = std::all_of(lengths.begin(), lengths.end(), [](int64_t n) { return n >= 0; }) &&
                       std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) == extent;
    SQ_CHECK(valid, ErrorKind::kInvalidArgument,
             node.describe() + ": split lengths must be non-negative and sum to " + std::to_string(extent) +
                 " (the input's axis " + std::to_string(axis) + ")");
  }
  std::vector<Tensor> pieces;
  int64_t begin = 0;
  for (int64_t length : lengths) {
    Tensor piece = slice_along_axis(x, axis, begin, length);
    if (squeeze) {
      Shape squeezed = piece.shape();
      squeezed.erase(squeezed.begin() + axis);
      piece = piece.reshaped(squeezed);
    }
    pieces.push_back(std::move(piece));
    begin += length;
  }
  ctx.set_output(0, Tensor::sequence(x.dtype(), std::move(pieces)));
}

}  // namespace

void register_sequence_kernels(KernelRegistry& r) {
  auto add = [&r](const char* op, void (*fn)(KernelContext&)) {
    r.add(op, [fn](const KernelInit&) -> std::unique_ptr<Kernel> { return std::make_unique<FunctionKernel>(fn); });
  };
  add("SequenceEmpty", sequence_empty);
  add("SequenceConstruct", sequence_construct);
  add("SequenceInsert", sequence_insert);
  add("SequenceAt", sequence_at);
  add("SequenceErase", sequence_erase);
  add("SequenceLength", sequence_length);
  add("ConcatFromSequence", concat_from_sequence);
  add("SplitToSequence", split_to_sequence);
}

}  // namespace slimquant::runtime
