#include "runtime/kernels/recurrent/subgraph.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace slimquant::runtime {

Subgraph::Subgraph(const ir::Node& node, const char* attr, bool loose_input_shapes) : node_(node), attr_(attr) {
  std::vector<size_t> captured;
  ir::Graph body = ir::standalone_subgraph(node, attr, captured);
  const size_t own_inputs = body.inputs.size() - captured.size();
  for (size_t i = 0; i < body.inputs.size(); ++i) {
    ir::ValueInfo& in = body.inputs[i];
    if (i < own_inputs) {
      input_names_.push_back(in.name);
      if (loose_input_shapes) in.dims.reset();
    } else {
      body.optional_values.insert(in.name);  // the outer value may be an empty optional
      captured_feeds_.emplace_back(in.name, node.declared_inputs() + captured[i - own_inputs]);
    }
  }
  outputs_ = body.outputs;
  SessionOptions options;
  options.max_cached_plans = 16;  // shapes of data-dependent values (box counts) vary per run
  options.split_batches = false;  // a body's leading dimension is whatever the body computes on
  try {
    session_ = std::make_unique<Session>(std::move(body), options);
  } catch (const Error& e) {
    fail(e.kind(), node.describe() + " " + attr + ": " + e.what());
  }
}

std::vector<Tensor> Subgraph::run(std::vector<Tensor> own_inputs, const KernelContext& ctx) {
  SQ_CHECK(own_inputs.size() == input_names_.size(), ErrorKind::kInternal,
           node_.describe() + " " + attr_ + ": fed " + std::to_string(own_inputs.size()) + " inputs, it takes " +
               std::to_string(input_names_.size()));
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < own_inputs.size(); ++i) feeds[input_names_[i]] = std::move(own_inputs[i]);
  for (const auto& [name, index] : captured_feeds_) feeds[name] = ctx.has_input(index) ? ctx.input(index) : Tensor();
  std::map<std::string, Tensor> out;
  try {
    out = session_->run(feeds);
  } catch (const Error& e) {
    fail(e.kind(), node_.describe() + " " + attr_ + ": " + e.what());
  }
  std::vector<Tensor> ordered;
  ordered.reserve(outputs_.size());
  for (const auto& o : outputs_) ordered.push_back(out.at(o.name));
  return ordered;
}

Tensor slice_along_axis(const Tensor& x, int64_t axis, int64_t begin, int64_t length) {
  Shape shape = x.shape();
  const int64_t extent = shape.at(static_cast<size_t>(axis));
  SQ_CHECK(begin >= 0 && length >= 0 && begin + length <= extent, ErrorKind::kInvalidArgument,
           "elements [" + std::to_string(begin) + ", " + std::to_string(begin + length) + ") of axis " +
               std::to_string(axis) + " of a tensor of shape " + shape_str(shape));
  shape[static_cast<size_t>(axis)] = length;
  Tensor out(x.dtype(), shape);
  if (out.nbytes() == 0) return out;
  const int64_t outer = shape_numel(Shape(shape.begin(), shape.begin() + axis));
  const size_t row = static_cast<size_t>(shape_numel(Shape(shape.begin() + axis + 1, shape.end()))) * dtype_size(x.dtype());
  const auto* src = static_cast<const std::byte*>(x.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + static_cast<size_t>(o * length) * row, src + static_cast<size_t>(o * extent + begin) * row,
                static_cast<size_t>(length) * row);
  return out;
}

namespace {
// A part's extent along the joined axis (1 for a stacked part, which has no such axis).
int64_t part_extent(const Tensor& part, int64_t axis, bool new_axis) {
  return new_axis ? 1 : part.dim(static_cast<size_t>(axis));
}
}  // namespace

Shape joined_shape(const std::vector<Tensor>& parts, int64_t axis, bool new_axis, const std::string& what) {
  SQ_CHECK(!parts.empty(), ErrorKind::kInvalidArgument, what + ": nothing to join (an empty sequence)");
  const Tensor& first = parts.front();
  const int64_t rank = static_cast<int64_t>(first.rank()) + (new_axis ? 1 : 0);
  axis = normalize_axis(axis, rank, what + " axis");
  Shape shape = first.shape();
  if (new_axis) shape.insert(shape.begin() + axis, 0);
  else shape[static_cast<size_t>(axis)] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    bool fits = p.dtype() == first.dtype() && p.rank() == first.rank() && !p.is_sequence();
    for (size_t d = 0; fits && d < p.rank(); ++d)
      fits = (!new_axis && static_cast<int64_t>(d) == axis) || p.dim(d) == first.dim(d);
    SQ_CHECK(fits, ErrorKind::kInvalidArgument,
             what + ": part " + std::to_string(i) + " is " + dtype_name(p.dtype()) + " " + shape_str(p.shape()) +
                 ", part 0 " + dtype_name(first.dtype()) + " " + shape_str(first.shape()) + "; they cannot be " +
                 (new_axis ? "stacked" : "concatenated along axis " + std::to_string(axis)));
    shape[static_cast<size_t>(axis)] += part_extent(p, axis, new_axis);
  }
  return shape;
}

void join_along_axis(const std::vector<Tensor>& parts, int64_t axis, bool new_axis, Tensor& out) {
  const int64_t rank = static_cast<int64_t>(out.rank());
  axis = normalize_axis(axis, rank, "join axis");
  const Shape& shape = out.shape();
  const int64_t outer = shape_numel(Shape(shape.begin(), shape.begin() + axis));
  const size_t row = static_cast<size_t>(shape_numel(Shape(shape.begin() + axis + 1, shape.end()))) * dtype_size(out.dtype());
  const int64_t total = shape[static_cast<size_t>(axis)];
  auto* dst = static_cast<std::byte*>(out.raw());
  int64_t offset = 0;
  for (const Tensor& p : parts) {
    const int64_t extent = part_extent(p, axis, new_axis);
    const auto* src = static_cast<const std::byte*>(p.raw());
    const size_t bytes = static_cast<size_t>(extent) * row;
    for (int64_t o = 0; o < outer && bytes > 0; ++o)
      std::memcpy(dst + static_cast<size_t>(o * total + offset) * row, src + static_cast<size_t>(o) * bytes, bytes);
    offset += extent;
  }
}

Shape empty_join_shape(const ir::ValueInfo& element) {
  Shape shape{0};
  if (element.fully_known()) {
    const Shape dims = element.shape();
    shape.insert(shape.end(), dims.begin(), dims.end());
  }
  return shape;
}

}  // namespace slimquant::runtime
