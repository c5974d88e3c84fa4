// Binary and n-ary elementwise ops with numpy broadcasting: arithmetic (Add Sub Mul Div Pow Mod
// PRelu BitShift), variadic (Max Min Sum Mean), comparison (Equal Less Greater LessOrEqual
// GreaterOrEqual), logic (And Or Xor) and Where.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>

#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/elementwise/float16_storage.h"
#include "runtime/kernels/elementwise/elementwise_register.h"

namespace slimquant::runtime::ew {
namespace {

// One broadcast row: a tight loop per inner-stride pattern (each stride is 0 or 1).
template <typename A, typename B, typename O, typename Op>
inline void binary_row(const A* a, int64_t sa, const B* b, int64_t sb, O* o, int64_t n, const Op& op) {
  if (sa != 0 && sb != 0) {
    for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b[i]);
  } else if (sa != 0) {
    const B bv = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], bv);
  } else if (sb != 0) {
    const A av = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = op(av, b[i]);
  } else {
    const O v = op(*a, *b);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  }
}

// out = op(a, b) with a and b broadcast to out's shape; `act` (float outputs only) is applied to
// each row while it is still in cache. `out` may alias `a` when a has out's shape.
template <typename A, typename B, typename O, typename Op>
void broadcast_binary(const Tensor& a, const Tensor& b, Tensor& out, const Op& op, const Activation& act,
                      const std::string& who) {
  const BroadcastPlan p = make_broadcast_plan(out.shape(), {&a.shape(), &b.shape()}, who);
  SQ_CHECK(a.dtype() == dtype_of<A> && b.dtype() == dtype_of<B> && out.dtype() == dtype_of<O>, ErrorKind::kInternal,
           who + ": dtype mismatch in broadcast_binary");
  const Storage<A>* pa = storage_ptr<A>(a.raw());
  const Storage<B>* pb = storage_ptr<B>(b.raw());
  Storage<O>* po = storage_ptr<O>(out.raw());
  const int64_t sa = p.inner_stride(0), sb = p.inner_stride(1);
  for_each_row(p, [&](const int64_t* off, int64_t o, int64_t n) {
    binary_row(pa + off[0], sa, pb + off[1], sb, po + o, n, op);
    if constexpr (std::is_same_v<O, float>) {
      if (act) apply_activation(act, po + o, n);
    }
  });
}

// The same for float32 a and b with a folded QuantizeLinear into `out` (uint8 or int8). Long rows
// are computed (and activated) into a per-thread buffer and quantized while in cache; short rows
// (channel-wise scaling of small maps: thousands of rows of a few dozen elements) go to one float32
// buffer first and are quantized in large spans, as a call per row would cost more than it saves.
template <typename Op>
void broadcast_binary_quantized(const Tensor& a, const Tensor& b, Tensor& out, const Op& op, const Activation& act,
                                const FoldedQuantize& q, const std::string& who) {
  constexpr int64_t kRowByRow = 1024;  // elements
  const BroadcastPlan p = make_broadcast_plan(out.shape(), {&a.shape(), &b.shape()}, who);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  auto* po = static_cast<std::byte*>(out.raw());  // 1-byte elements
  const int64_t sa = p.inner_stride(0), sb = p.inner_stride(1);
  if (p.row_len() >= kRowByRow) {
    for_each_row(p, [&](const int64_t* off, int64_t o, int64_t n) {
      thread_local std::vector<float> row;
      if (row.size() < static_cast<size_t>(n)) row.resize(static_cast<size_t>(n));
      binary_row(pa + off[0], sa, pb + off[1], sb, row.data(), n, op);
      if (act) apply_activation(act, row.data(), n);
      quantize_floats(row.data(), n, q.scale[0], q.zero_point[0], q.dtype, po + o);
    });
    return;
  }
  thread_local std::vector<float> values;
  if (values.size() < static_cast<size_t>(p.numel)) values.resize(static_cast<size_t>(p.numel));
  float* v = values.data();
  for_each_row(p, [&](const int64_t* off, int64_t o, int64_t n) {
    binary_row(pa + off[0], sa, pb + off[1], sb, v + o, n, op);
    if (act) apply_activation(act, v + o, n);
  });
  parallel_range(p.numel, [&](int64_t begin, int64_t end) {
    quantize_floats(v + begin, end - begin, q.scale[0], q.zero_point[0], q.dtype, po + begin);
  });
}

// The element offset of every row of `p` (rows in order), per input: fn(in_offsets, out_offset, len).
// Sequential, for work that is already split across threads.
template <typename Fn>
void for_each_row_sequential(const BroadcastPlan& p, Fn&& fn) {
  const int64_t len = p.row_len(), rows = p.rows();
  for (int64_t r = 0; r < rows; ++r) {
    std::array<int64_t, kMaxInputs> off = row_start_offsets(p, r);
    fn(off.data(), r * len, len);
  }
}

// The same for float32 a and b with a folded per-channel QuantizeLinear into `out` (uint8 or
// int8): the output is split into slabs, one per (index before the axis, channel), each computed
// (and activated) into a per-thread buffer that stays in cache and quantized with its channel's
// scale and zero point. Every input is broadcast within a slab by a plan over the dims after the
// axis, and picks its slab by a plan over the dims up to the axis. False (nothing written) when
// slabs are too short to pay for that (the caller computes, then quantizes in a second pass).
template <typename Op>
bool broadcast_binary_channel_quantized(const Tensor& a, const Tensor& b, Tensor& out, const Op& op,
                                        const Activation& act, const FoldedChannelQuantize& q, const std::string& who) {
  constexpr int64_t kMinSlab = 64;  // elements
  const Shape& shape = out.shape();
  const size_t rank = shape.size(), axis = static_cast<size_t>(q.axis);
  if (axis >= rank || shape[axis] != static_cast<int64_t>(q.scale.size())) return false;
  const Shape lead_out(shape.begin(), shape.begin() + axis + 1), trail_out(shape.begin() + axis + 1, shape.end());
  if (shape_numel(trail_out) < kMinSlab) return false;
  // Inputs padded with leading 1s to out's rank (numpy alignment), split at the axis.
  std::array<Shape, 2> lead, trail;
  std::array<int64_t, 2> slab_elements{};
  const std::array<const Tensor*, 2> in = {&a, &b};
  for (size_t k = 0; k < 2; ++k) {
    if (in[k]->rank() > rank) return false;  // the broadcast check below names the problem
    Shape padded(rank - in[k]->rank(), 1);
    padded.insert(padded.end(), in[k]->shape().begin(), in[k]->shape().end());
    lead[k].assign(padded.begin(), padded.begin() + axis + 1);
    trail[k].assign(padded.begin() + axis + 1, padded.end());
    slab_elements[k] = shape_numel(trail[k]);
  }
  const BroadcastPlan slabs = make_broadcast_plan(lead_out, {&lead[0], &lead[1]}, who);
  const BroadcastPlan rows = make_broadcast_plan(trail_out, {&trail[0], &trail[1]}, who);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  auto* po = static_cast<std::byte*>(out.raw());  // 1-byte elements
  const int64_t slab_len = rows.numel, channels = shape[axis];
  const int64_t sa = rows.inner_stride(0), sb = rows.inner_stride(1);
  const int nd = static_cast<int>(slabs.dims.size());
  // Whole slabs per thread: a slab is at least kMinSlab elements, and usually thousands.
  const int64_t num_slabs = slabs.numel;
  const int nt = std::max(1, std::min(threads_for(out.numel()), static_cast<int>(num_slabs)));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t s = 0; s < num_slabs; ++s) {
    thread_local std::vector<float> values;
    if (values.size() < static_cast<size_t>(slab_len)) values.resize(static_cast<size_t>(slab_len));
    std::array<int64_t, 2> base{};
    int64_t rem = s;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t i = rem % slabs.dims[d];
      rem /= slabs.dims[d];
      for (int k = 0; k < 2; ++k) base[k] += i * slabs.strides[k][d];
    }
    float* v = values.data();
    for_each_row_sequential(rows, [&](const int64_t* off, int64_t o, int64_t n) {
      binary_row(pa + base[0] * slab_elements[0] + off[0], sa, pb + base[1] * slab_elements[1] + off[1], sb, v + o, n, op);
    });
    if (act) apply_activation(act, v, slab_len);
    const int64_t c = s % channels;
    quantize_floats(v, slab_len, q.scale[c], q.zero_point[c], q.dtype, po + s * slab_len);
  }
  return true;
}

[[noreturn]] void fail_dtype(const ir::Node& node, DType t) {
  fail(ErrorKind::kUnsupported,
       node.describe() + ": input dtype " + std::string(dtype_name(t)) + " is not supported by " + node.op_type);
}

void check_same_dtype(const ir::Node& node, const Tensor& a, const Tensor& b, size_t ib) {
  if (a.dtype() != b.dtype())
    fail(ErrorKind::kInvalidArgument, node.describe() + ": input " + std::to_string(ib) + " has dtype " +
                                          dtype_name(b.dtype()) + " but input 0 has " + dtype_name(a.dtype()) +
                                          " (they must match)");
}

// ---- op functors: Accepts<T> says which input dtypes the op takes, Out<T> its output dtype ----

template <template <typename> class Pred, typename Fn>
struct SameTypeOp {
  template <typename T> static constexpr bool kAccepts = Pred<T>::value;
  template <typename T> using Out = T;
  Fn fn;
  template <typename T> T operator()(T a, T b) const { return fn(a, b); }
};

struct AddFn { template <typename T> T operator()(T a, T b) const { return wrap_add(a, b); } };
struct SubFn { template <typename T> T operator()(T a, T b) const { return wrap_sub(a, b); } };
struct MulFn { template <typename T> T operator()(T a, T b) const { return wrap_mul(a, b); } };
struct DivFn { template <typename T> T operator()(T a, T b) const { return div_t(a, b); } };
struct MaxFn { template <typename T> T operator()(T a, T b) const { return max_t(a, b); } };
struct MinFn { template <typename T> T operator()(T a, T b) const { return min_t(a, b); } };
// Bools arrive as bytes holding 0 or 1 (see Storage<T>).
struct AndFn { template <typename T> T operator()(T a, T b) const { return a & b; } };
struct OrFn { template <typename T> T operator()(T a, T b) const { return a | b; } };
struct XorFn { template <typename T> T operator()(T a, T b) const { return a ^ b; } };

struct PReluFn {
  template <typename T> T operator()(T x, T slope) const { return select(x < T(0), wrap_mul(x, slope), x); }
};

// Mod: fmod = 0 takes the sign of the divisor (Python %), fmod = 1 of the dividend (C fmod).
// Division by zero gives 0 for integers instead of trapping.
struct ModFn {
  bool fmod = false;
  template <typename T> T operator()(T a, T b) const {
    if constexpr (kIsFloat<T>) {
      return std::fmod(a, b);
    } else {
      if (b == 0) return T(0);
      if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return T(0);
        T r = static_cast<T>(a % b);
        if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
        return r;
      } else {
        return static_cast<T>(a % b);
      }
    }
  }
};

// Shifts by the type's width or more give 0 (undefined in C++).
struct BitShiftFn {
  bool left = true;
  template <typename T> T operator()(T a, T b) const {
    if (b >= T(sizeof(T) * 8)) return T(0);
    return left ? static_cast<T>(a << b) : static_cast<T>(a >> b);
  }
};

template <template <typename> class Pred, typename Fn>
struct CompareOp {
  template <typename T> static constexpr bool kAccepts = Pred<T>::value;
  template <typename T> using Out = bool;
  Fn fn;
  template <typename T> bool operator()(T a, T b) const { return fn(a, b); }
};
struct EqFn { template <typename T> bool operator()(T a, T b) const { return a == b; } };
struct LtFn { template <typename T> bool operator()(T a, T b) const { return a < b; } };
struct GtFn { template <typename T> bool operator()(T a, T b) const { return a > b; } };
struct LeFn { template <typename T> bool operator()(T a, T b) const { return a <= b; } };
struct GeFn { template <typename T> bool operator()(T a, T b) const { return a >= b; } };

// o = a op b over n floats, compiled for AVX2 and AVX-512 too: the channel-blocked rows of an Add /
// Sub / Mul with two operands of stride 1 (5-10% faster on det's maps than binary_row's baseline
// SSE2 loop, whose data mostly comes from L2 / L3).
template <LaneQuantizer::Combine kOp>
SQ_AVX512_AVX2_CLONES void combine_floats(const float* __restrict a, const float* __restrict b, float* __restrict o,
                                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (kOp == LaneQuantizer::Combine::kAdd) o[i] = a[i] + b[i];
    else if constexpr (kOp == LaneQuantizer::Combine::kSub) o[i] = a[i] - b[i];
    else o[i] = a[i] * b[i];
  }
}

// The LaneQuantizer::Combine that computes Op on float32 (quantize_combined), if any.
template <typename Op>
constexpr std::optional<LaneQuantizer::Combine> lane_combine() {
  if constexpr (std::is_same_v<Op, SameTypeOp<NumericP, AddFn>>) return LaneQuantizer::Combine::kAdd;
  else if constexpr (std::is_same_v<Op, SameTypeOp<NumericP, SubFn>>) return LaneQuantizer::Combine::kSub;
  else if constexpr (std::is_same_v<Op, SameTypeOp<NumericP, MulFn>>) return LaneQuantizer::Combine::kMul;
  else return std::nullopt;
}

// ---- kernels ----

enum class Broadcast { kMulti, kToFirst };  // numpy multidirectional, or onto input 0's shape (PRelu)

template <typename Op>
class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(const KernelInit& init, Op op, bool fusable, Broadcast mode = Broadcast::kMulti)
      : node_(init.node), op_(op), mode_(mode), quantize_(folded_quantize(init.node)),
        channel_quantize_(folded_channel_quantize(init.node)), dequantize_(folded_dequantize(init.node)) {
    for (const FoldedDequantize& d : dequantize_)
      if (d.input > 1)
        fail(ErrorKind::kInvalidModel, node_.describe() + ": invalid folded DequantizeLinear attributes");
    scaled_input_ = node_.attr_int(kScaledInput, -1);
    if (scaled_input_ >= 0 && (scaled_input_ > 1 || node_.inputs.size() != 3 ||
                               scaled_input_ == node_.attr_int(kNearestUpsampledInput, -1)))
      fail(ErrorKind::kInvalidModel, node_.describe() + ": invalid folded scaling attributes");
    if (fusable) act_ = resolve_fused_activation(node_);
    else reject_fused_activation(node_);
    upsampled_input_ = node_.attr_int(kNearestUpsampledInput, -1);
    if (upsampled_input_ >= 0) {
      factors_ = node_.attr_ints(kNearestUpsampleFactors);
      if (upsampled_input_ > 1 || mode_ != Broadcast::kMulti || factors_.size() != 2 || factors_[0] < 1 ||
          factors_[1] < 1)
        fail(ErrorKind::kInvalidModel, node_.describe() + ": invalid folded nearest upsampling attributes");
    }
    if (channel_quantize_) {
      const int64_t channels = static_cast<int64_t>(channel_quantize_->scale.size());
      channel_scale_ = Tensor::from_vector<float>({channels}, channel_quantize_->scale);
      channel_zero_point_ = Tensor(channel_quantize_->dtype, {channels});
      for (int64_t c = 0; c < channels; ++c) {
        const int32_t z = channel_quantize_->zero_point[static_cast<size_t>(c)];
        if (channel_quantize_->dtype == DType::kUInt8) channel_zero_point_.data<uint8_t>()[c] = static_cast<uint8_t>(z);
        else channel_zero_point_.data<int8_t>()[c] = static_cast<int8_t>(z);
      }
      lane_quantizer_.emplace(*channel_quantize_, channels);
    }
  }

  void run(KernelContext& ctx) override {
    // Channel-blocked inputs (a channel-blocked step): read as they are, or converted to plain.
    const bool blocked = ctx.input_layout(0) || ctx.input_layout(1);
    if (blocked && run_channel_blocked(ctx)) return;
    // Plain (and float32 where the plan stored float16) from here on.
    auto operand = [&](size_t k) {
      return blocked ? channel_blocked::plain_input(ctx, k) : as_float32(ctx.input(k));
    };
    if (dequantize_.empty() && scaled_input_ < 0) {
      run_plain(ctx, operand(0), operand(1));
      return;
    }
    // Folded DequantizeLinears and scaling outside the blocked path: the floats they stand for, then
    // the op.
    std::array<Tensor, 2> in = {operand(0), operand(1)};
    for (const FoldedDequantize& d : dequantize_) in[d.input] = dequantized(in[d.input], d, node_.describe());
    if (scaled_input_ >= 0) {
      const std::string who = node_.describe();
      Tensor& x = in[static_cast<size_t>(scaled_input_)];
      const Tensor factor = channel_blocked::plain_input(ctx, 2);
      SQ_CHECK(x.dtype() == DType::kFloat32 && factor.dtype() == DType::kFloat32, ErrorKind::kInternal,
               who + ": a folded scaling needs float32 operands");
      Tensor scaled(DType::kFloat32, broadcast_all({&x.shape(), &factor.shape()}, who));
      broadcast_binary<float, float, float>(x, factor, scaled, SameTypeOp<NumericP, MulFn>{}, Activation{}, who);
      x = std::move(scaled);
    }
    run_plain(ctx, in[0], in[1]);
  }

 private:
  void run_plain(KernelContext& ctx, const Tensor& a, const Tensor& b) {
    if (upsampled_input_ >= 0) {
      run_upsampled(ctx, a, b);
      return;
    }
    check_same_dtype(node_, a, b, 1);
    const std::string who = node_.describe();
    const Shape out_shape = mode_ == Broadcast::kToFirst ? a.shape() : broadcast_all({&a.shape(), &b.shape()}, who);
    if (channel_quantize_) {
      if constexpr (Op::template kAccepts<float> && std::is_same_v<typename Op::template Out<float>, float>) {
        if (a.dtype() == DType::kFloat32) {
          Tensor& out = ctx.allocate_output(0, channel_quantize_->dtype, out_shape);
          if (mode_ == Broadcast::kMulti &&
              broadcast_binary_channel_quantized(a, b, out, op_, act_, *channel_quantize_, who))
            return;
          // Short slabs (the axis is last, or nearly): the op, then the Q as it was.
          Tensor result(DType::kFloat32, out_shape);
          broadcast_binary<float, float, float>(a, b, result, op_, act_, who);
          quantize_linear(result, channel_scale_, &channel_zero_point_, channel_quantize_->axis, out, who);
          return;
        }
      }
      fail(ErrorKind::kInternal, who + ": a folded per-channel QuantizeLinear needs float32 arithmetic");
    }
    if (quantize_ && a.dtype() == DType::kFloat32) {
      if constexpr (Op::template kAccepts<float> && std::is_same_v<typename Op::template Out<float>, float>) {
        Tensor& out = ctx.allocate_output(0, quantize_->dtype, out_shape);
        broadcast_binary_quantized(a, b, out, op_, act_, *quantize_, who);
        return;
      }
    }
    dispatch_dtype(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template kAccepts<T>) {
        using O = typename Op::template Out<T>;
        if (act_ && !std::is_same_v<O, float>)
          fail(ErrorKind::kUnsupported, who + ": fused activation needs float32 data");
        if (!quantize_) {
          Tensor& out = ctx.allocate_output(0, dtype_of<O>, out_shape);
          broadcast_binary<T, T, O>(a, b, out, op_, act_, who);
          return;
        }
        // Other input types (an int32 sum before a QuantizeLinear): the op, then the Q as it was.
        Tensor result(dtype_of<O>, out_shape);
        broadcast_binary<T, T, O>(a, b, result, op_, act_, who);
        Tensor zero_point(quantize_->dtype, {});
        if (quantize_->dtype == DType::kUInt8) zero_point.data<uint8_t>()[0] = static_cast<uint8_t>(quantize_->zero_point[0]);
        else zero_point.data<int8_t>()[0] = static_cast<int8_t>(quantize_->zero_point[0]);
        Tensor& out = ctx.allocate_output(0, quantize_->dtype, out_shape);
        quantize_linear(result, Tensor::scalar<float>(quantize_->scale[0]), &zero_point, 1, out, who);
      } else {
        fail_dtype(node_, a.dtype());
      }
    });
  }

  // One operand read through a folded nearest Resize (see kNearestUpsampledInput): each
  // (n, c) slab is computed row by row, reading the small map's row y / kh with every element
  // repeated kw times, then activated and quantized (a folded Q) while in cache.
  void run_upsampled(KernelContext& ctx, const Tensor& a, const Tensor& b) {
    const std::string who = node_.describe();
    if constexpr (Op::template kAccepts<float> && std::is_same_v<typename Op::template Out<float>, float>) {
      const Tensor& small = upsampled_input_ == 0 ? a : b;
      const Tensor& full = upsampled_input_ == 0 ? b : a;
      const int64_t kh = factors_[0], kw = factors_[1];
      SQ_CHECK(small.dtype() == DType::kFloat32 && full.dtype() == DType::kFloat32 && small.rank() == 4 &&
                   full.rank() == 4 && full.dim(0) == small.dim(0) && full.dim(1) == small.dim(1) &&
                   full.dim(2) == small.dim(2) * kh && full.dim(3) == small.dim(3) * kw,
               ErrorKind::kInternal,
               who + ": operands " + shape_str(full.shape()) + " and " + shape_str(small.shape()) +
                   " do not match the folded nearest upsampling");
      const Shape& shape = full.shape();
      const int64_t channels = shape[1], height = shape[2], width = shape[3], w = small.dim(3);
      const int64_t slab = height * width, slabs = shape[0] * channels;
      const bool channel_slabs = channel_quantize_ && channel_quantize_->axis == 1 &&
                                 static_cast<int64_t>(channel_quantize_->scale.size()) == channels;
      // A per-channel Q along another axis: float32 first, then the Q as it was.
      const bool separate_quantize = channel_quantize_ && !channel_slabs;
      const DType out_type = channel_quantize_ ? channel_quantize_->dtype : quantize_ ? quantize_->dtype : DType::kFloat32;
      Tensor& out = ctx.allocate_output(0, out_type, shape);
      Tensor values = out_type == DType::kFloat32 ? out : separate_quantize ? Tensor(DType::kFloat32, shape) : Tensor();
      const float* pf = full.data<float>();
      const float* ps = small.data<float>();
      const bool small_first = upsampled_input_ == 0;
      const int nt = std::max(1, std::min(threads_for(full.numel()), static_cast<int>(slabs)));
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t s = 0; s < slabs; ++s) {
        thread_local std::vector<float> buffer;
        float* v;
        if (values.defined()) {
          v = values.data<float>() + s * slab;
        } else {
          if (buffer.size() < static_cast<size_t>(slab)) buffer.resize(static_cast<size_t>(slab));
          v = buffer.data();
        }
        const float* f = pf + s * slab;
        const float* sm = ps + s * small.dim(2) * w;
        // The small map's row, widened once per kh output rows; each output row is then one
        // vectorised binary_row.
        thread_local std::vector<float> widened;
        if (widened.size() < static_cast<size_t>(width)) widened.resize(static_cast<size_t>(width));
        float* wide = widened.data();
        for (int64_t y = 0; y < height; ++y) {
          if (y % kh == 0) {
            const float* srow = sm + (y / kh) * w;
            for (int64_t xs = 0; xs < w; ++xs)
              for (int64_t j = 0; j < kw; ++j) wide[xs * kw + j] = srow[xs];
          }
          const float* frow = f + y * width;
          float* vrow = v + y * width;
          if (small_first) binary_row(wide, 1, frow, 1, vrow, width, op_);
          else binary_row(frow, 1, wide, 1, vrow, width, op_);
        }
        if (act_) apply_activation(act_, v, slab);
        auto* q = static_cast<std::byte*>(out.raw()) + s * slab;  // 1-byte elements when quantized
        if (channel_slabs) {
          const size_t c = static_cast<size_t>(s % channels);
          quantize_floats(v, slab, channel_quantize_->scale[c], channel_quantize_->zero_point[c], out_type, q);
        } else if (quantize_ && !channel_quantize_) {
          quantize_floats(v, slab, quantize_->scale[0], quantize_->zero_point[0], out_type, q);
        }
      }
      if (separate_quantize) quantize_linear(values, channel_scale_, &channel_zero_point_, channel_quantize_->axis, out, who);
    } else {
      fail(ErrorKind::kInternal, who + ": a folded nearest upsampling needs float32 arithmetic");
    }
  }

  // How an operand of a channel-blocked step is read: the output's own element order, or one
  // value per (n, c) (a per-channel [N|1, C|1, 1, 1] operand: plain, or blocked with H * W = 1,
  // which is the same order), lane stride 1 (per channel) or 0 (per sample).
  struct BlockedOperand {
    const float* data = nullptr;
    bool full = false;
    int64_t batch_stride = 0, lane_stride = 0;
    // A folded DequantizeLinear's codes (full operands only): dequantized chunk by chunk.
    const std::byte* codes = nullptr;
    DType code_type = DType::kUndefined;
    const FoldedDequantize* dequantize = nullptr;
    // Float16 storage (full operands only, KernelLayouts::float16_inputs): widened chunk by chunk.
    const uint16_t* halves = nullptr;
  };

  const FoldedDequantize* dequantize_of(size_t k) const {
    for (const FoldedDequantize& d : dequantize_)
      if (d.input == k) return &d;
    return nullptr;
  }

  static std::optional<BlockedOperand> blocked_operand(const Tensor& t, const Layout* layout, const Shape& out) {
    BlockedOperand o;
    if (t.dtype() == DType::kFloat16) {
      if (!layout || t.shape() != out) return std::nullopt;
      o.halves = static_cast<const uint16_t*>(t.raw());
      o.full = true;
      return o;
    }
    o.data = t.data<float>();
    if (layout && t.shape() == out) {
      o.full = true;
      return o;
    }
    if (t.rank() > 4) return std::nullopt;
    Shape p(4 - t.rank(), 1);
    p.insert(p.end(), t.shape().begin(), t.shape().end());
    if (p[2] != 1 || p[3] != 1 || (p[1] != out[1] && p[1] != 1) || (p[0] != out[0] && p[0] != 1)) return std::nullopt;
    o.lane_stride = p[1] == 1 ? 0 : 1;
    o.batch_stride = p[0] == 1 ? 0 : p[1];
    return o;
  }

  // What run_channel_blocked computes: the two operands, the output's shape and the full
  // operand's layout (the output's, retyped), and for a folded upsampling its factors and the
  // small map's size.
  struct BlockedPlan {
    std::array<BlockedOperand, 3> in;  // the operands, then a folded scaling's factor
    Shape out_shape;
    const Layout* out_like = nullptr;
    int64_t kh = 1, kw = 1, small_height = 0, small_width = 0;
  };

  // Operand k in the output's element order: float32 (or float16), or a folded DequantizeLinear's codes.
  std::optional<BlockedOperand> full_operand(const KernelContext& ctx, size_t k) const {
    const Tensor& t = ctx.input(k);
    BlockedOperand o;
    o.full = true;
    if (const FoldedDequantize* d = dequantize_of(k)) {
      if (t.dtype() != DType::kUInt8 && t.dtype() != DType::kInt8) return std::nullopt;
      o.codes = static_cast<const std::byte*>(t.raw());
      o.code_type = t.dtype();
      o.dequantize = d;
      return o;
    }
    if (t.dtype() == DType::kFloat16) {
      o.halves = static_cast<const uint16_t*>(t.raw());
      return o;
    }
    if (t.dtype() != DType::kFloat32) return std::nullopt;
    o.data = t.data<float>();
    return o;
  }

  std::optional<BlockedPlan> plan_channel_blocked(KernelContext& ctx) const {
    BlockedPlan plan;
    if (upsampled_input_ >= 0) {
      const size_t s = static_cast<size_t>(upsampled_input_), f = 1 - s;
      if (dequantize_of(s) || ctx.input(s).dtype() != DType::kFloat32) return std::nullopt;
      const Tensor& small = ctx.input(s);
      const Tensor& full = ctx.input(f);
      plan.kh = factors_[0];
      plan.kw = factors_[1];
      if (!ctx.input_layout(s) || !ctx.input_layout(f) || small.rank() != 4 || full.rank() != 4 ||
          full.dim(0) != small.dim(0) || full.dim(1) != small.dim(1) || full.dim(2) != small.dim(2) * plan.kh ||
          full.dim(3) != small.dim(3) * plan.kw)
        return std::nullopt;
      plan.out_shape = full.shape();
      plan.out_like = ctx.input_layout(f);
      plan.small_height = small.dim(2);
      plan.small_width = small.dim(3);
      plan.in[s] = BlockedOperand{small.data<float>(), true, 0, 0};
      const std::optional<BlockedOperand> full_in = full_operand(ctx, f);
      if (!full_in) return std::nullopt;
      plan.in[f] = *full_in;
    } else {
      plan.out_shape = broadcast_all({&ctx.input(0).shape(), &ctx.input(1).shape()}, node_.describe());
      if (plan.out_shape.size() != 4) return std::nullopt;
      for (size_t k = 0; k < 2; ++k) {
        const Tensor& t = ctx.input(k);
        if (dequantize_of(k)) {
          // Codes in the output's element order only (the squeeze-excitation input).
          const std::optional<BlockedOperand> o = full_operand(ctx, k);
          if (!o || !ctx.input_layout(k) || t.shape() != plan.out_shape) return std::nullopt;
          plan.in[k] = *o;
          plan.out_like = ctx.input_layout(k);
          continue;
        }
        if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat16) return std::nullopt;
        const std::optional<BlockedOperand> o = blocked_operand(t, ctx.input_layout(k), plan.out_shape);
        if (!o) return std::nullopt;
        plan.in[k] = *o;
        if (o->full) plan.out_like = ctx.input_layout(k);
      }
      if (!plan.out_like) return std::nullopt;
    }
    const int64_t channels = plan.out_shape[1];
    if (channel_quantize_ && (channel_quantize_->axis != 1 || static_cast<int64_t>(channel_quantize_->scale.size()) != channels))
      return std::nullopt;
    if (scaled_input_ >= 0) {  // the factor: per channel, per (n, c) or one value
      const Tensor& factor = ctx.input(2);
      if (factor.dtype() != DType::kFloat32 || !plan.in[static_cast<size_t>(scaled_input_)].full) return std::nullopt;
      const std::optional<BlockedOperand> o = blocked_operand(factor, ctx.input_layout(2), plan.out_shape);
      if (!o || o->full) return std::nullopt;
      plan.in[2] = *o;
    }
    return plan;
  }

  // One output row's view of operand k: a pointer, a stride (0: one value for every element) and
  // how far a chunk starting `first` elements into the row moves the pointer (`first * advance`).
  // `wide` holds the upsampled small map's row widened to the output's (advance 1), or a
  // per-channel operand's B values repeated over `chunk_pixels` pixels, the same for every chunk
  // (advance 0: an L1-sized buffer, where a whole row of 96 channels-last lanes would be 60 KB);
  // refilled when `refill`.
  const float* operand_row(const BlockedPlan& plan, size_t k, const channel_blocked::View& v, int64_t plane,
                           int64_t y, int64_t chunk_pixels, bool refill, float* wide, int64_t& stride,
                           int64_t& advance) const {
    const BlockedOperand& o = plan.in[k];
    const int64_t lanes = v.block, row_len = v.width * lanes;
    stride = 1;
    advance = 1;
    if (o.codes || o.halves) return nullptr;  // dequantized or widened per chunk (run_channel_blocked)
    if (upsampled_input_ == static_cast<int>(k)) {
      // The small map's row y / kh, each pixel's lanes repeated kw times.
      if (refill) {
        const int64_t small_row = plan.small_width * lanes, small_plane = plan.small_height * small_row;
        const float* src = o.data + plane * small_plane + (y / plan.kh) * small_row;
        for (int64_t xs = 0; xs < plan.small_width; ++xs)
          for (int64_t j = 0; j < plan.kw; ++j)
            std::memcpy(wide + (xs * plan.kw + j) * lanes, src + xs * lanes, static_cast<size_t>(lanes) * sizeof(float));
      }
      return wide;
    }
    if (o.full) return o.data + plane * v.plane_elements() + y * row_len;
    const int64_t batch = plane / v.blocks(), cb = plane % v.blocks();
    advance = 0;
    if (o.lane_stride == 0) {
      stride = 0;
      return o.data + batch * o.batch_stride;
    }
    // This plane's B channel values, repeated for every pixel of a chunk.
    if (refill) {
      const float* src = o.data + batch * o.batch_stride + cb * lanes;
      for (int64_t x = 0; x < std::min(chunk_pixels, v.width); ++x)
        std::memcpy(wide + x * lanes, src, static_cast<size_t>(lanes) * sizeof(float));
    }
    return wide;
  }

  // Channel-blocked inputs (kernels/elementwise/channel_blocked.h), float32 arithmetic: the output is written
  // in their blocking, one (n, channel block, row) of W pixels x B lanes at a time, in chunks of
  // pixels, with the same per-element arithmetic, activation and folded Q as the plain paths (so
  // the same bits). An
  // operand is either in the output's element order or per channel (the squeeze-excitation gate);
  // a folded nearest upsampling widens the small map's row once per kh output rows. False
  // (nothing written) for the cases this does not cover.
  bool run_channel_blocked(KernelContext& ctx) {
    if constexpr (Op::template kAccepts<float> && std::is_same_v<typename Op::template Out<float>, float>) {
      const std::optional<channel_blocked::Blocking> blocking = channel_blocked::common_blocking(ctx, {0, 1});
      if (!blocking || mode_ != Broadcast::kMulti || !ctx.output_layout_allowed(0)) return false;
      const std::optional<BlockedPlan> plan = plan_channel_blocked(ctx);
      if (!plan) return false;
      const DType out_type = channel_quantize_ ? channel_quantize_->dtype : quantize_ ? quantize_->dtype : DType::kFloat32;
      Tensor& out = ctx.allocate_output(0, out_type, plan->out_shape);
      const channel_blocked::View v(plan->out_shape, *blocking);
      const int64_t lanes = v.block, row_len = v.width * lanes, rows_per_plane = v.height;
      const int64_t units = v.n * v.blocks() * rows_per_plane;
      auto* po = static_cast<std::byte*>(out.raw());
      // A row goes in chunks of about kChunkFloats (whole tiles of the lane quantizer), each
      // computed into a buffer that stays in L1 (and quantized from there) with a per-channel
      // operand widened over one chunk only: a whole row of a wide channels-last map (60 KB for
      // 96 channels x 160) would pass through L2 twice.
      constexpr int64_t kChunkFloats = 2048;
      const int64_t tile = LaneQuantizer::pixels_per_tile(lanes);
      const int64_t chunk_pixels = std::max(tile, kChunkFloats / lanes / tile * tile);
      // Add, Sub, Mul into a per-channel Q without an activation: op and quantization in one pass.
      constexpr std::optional<LaneQuantizer::Combine> kCombine = lane_combine<Op>();
      const bool combined_quantize = kCombine && channel_quantize_ && !act_;
      // The float16 operand a per-tensor Q takes straight into its codes with the other, float32
      // operand (the gate Mul), not widened first; -1 when none.
      const int halves_into_codes = [&] {
        const int h = plan->in[0].halves ? 0 : plan->in[1].halves ? 1 : -1;
        if (!kCombine || h < 0 || !quantize_ || act_ || scaled_input_ >= 0) return -1;
        const BlockedOperand& other = plan->in[static_cast<size_t>(1 - h)];
        return other.codes || other.halves ? -1 : h;
      }();
      auto run_units = [&](int64_t u0, int64_t u1) {
        thread_local std::vector<float> widened_a, widened_b, widened_factor;  // rows
        thread_local std::vector<float> values, dequantized_a, dequantized_b, scaled;  // chunks
        for (std::vector<float>* buf : {&widened_a, &widened_b, &widened_factor})
          if (buf->size() < static_cast<size_t>(row_len)) buf->resize(static_cast<size_t>(row_len));
        const auto chunk_floats = static_cast<size_t>(chunk_pixels * lanes);
        for (std::vector<float>* buf : {&values, &dequantized_a, &dequantized_b, &scaled})
          if (buf->size() < chunk_floats) buf->resize(chunk_floats);
        const std::array<float*, 3> wide = {widened_a.data(), widened_b.data(), widened_factor.data()};
        const std::array<float*, 2> dequantized_chunk = {dequantized_a.data(), dequantized_b.data()};
        int64_t widened_key = -1;  // the (plane, source row) the widened rows hold
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t plane = u / rows_per_plane, y = u % rows_per_plane;
          const int64_t key = upsampled_input_ >= 0 ? plane * plan->small_height + y / plan->kh : plane;
          std::array<const float*, 3> row{};
          std::array<int64_t, 3> stride{}, advance{};
          const size_t operands = scaled_input_ >= 0 ? 3 : 2;
          for (size_t k = 0; k < operands; ++k)
            row[k] = operand_row(*plan, k, v, plane, y, chunk_pixels, key != widened_key, wide[k], stride[k], advance[k]);
          widened_key = key;
          const int64_t offset = plane * v.plane_elements() + y * row_len;
          for (int64_t x0 = 0; x0 < v.width; x0 += chunk_pixels) {
            const int64_t pixels = std::min(chunk_pixels, v.width - x0), first = x0 * lanes, n = pixels * lanes;
            if constexpr (kCombine.has_value()) {
              const auto h = static_cast<size_t>(halves_into_codes), f = 1 - h;
              if (halves_into_codes >= 0 && stride[f] == 1 &&
                  quantize_combined_with_halves(*kCombine, plan->in[h].halves + offset + first,
                                                row[f] + first * advance[f], h == 0, n, quantize_->scale[0],
                                                quantize_->zero_point[0], out_type, po + offset + first))
                continue;
            }
            std::array<const float*, 2> chunk{};
            for (size_t k = 0; k < 2; ++k) {
              const BlockedOperand& o = plan->in[k];
              if (o.halves) {
                widen_float16(o.halves + offset + first, dequantized_chunk[k], n);
                chunk[k] = dequantized_chunk[k];
              } else if (o.codes) {
                dequantize_codes(o.codes + offset + first, o.code_type, n, o.dequantize->scale,
                                 o.dequantize->zero_point, dequantized_chunk[k]);
                chunk[k] = dequantized_chunk[k];
              } else {
                chunk[k] = row[k] + first * advance[k];
              }
            }
            if (scaled_input_ >= 0) {  // the folded Mul's float32 product, as it wrote it
              const size_t k = static_cast<size_t>(scaled_input_);
              const float* factor = row[2] + first * advance[2];
              if (stride[2] == 1) {
                combine_floats<LaneQuantizer::Combine::kMul>(chunk[k], factor, scaled.data(), n);
              } else {
                const float f = *factor;
                for (int64_t i = 0; i < n; ++i) scaled[static_cast<size_t>(i)] = chunk[k][i] * f;
              }
              chunk[k] = scaled.data();
            }
            const float* a = chunk[0];
            const float* b = chunk[1];
            const bool contiguous = stride[0] == 1 && stride[1] == 1;
            if (combined_quantize && contiguous) {
              lane_quantizer_->quantize_combined(*kCombine, a, b, pixels, (plane % v.blocks()) * lanes, lanes,
                                                 po + offset + first);
              continue;
            }
            // The same for a per-tensor Q (a squeeze-excitation's gate Mul into the projection's codes).
            if constexpr (kCombine.has_value())
              if (quantize_ && !act_ && contiguous &&
                  quantize_combined_floats(*kCombine, a, b, n, quantize_->scale[0], quantize_->zero_point[0], out_type,
                                           po + offset + first))
                continue;
            float* result = out_type == DType::kFloat32 ? reinterpret_cast<float*>(po) + offset + first : values.data();
            if constexpr (kCombine.has_value()) {
              if (contiguous) combine_floats<*kCombine>(a, b, result, n);
              else binary_row(a, stride[0], b, stride[1], result, n, op_);
            } else {
              binary_row(a, stride[0], b, stride[1], result, n, op_);
            }
            if (act_) apply_activation(act_, result, n);
            if (channel_quantize_)
              lane_quantizer_->quantize(result, lanes, pixels, (plane % v.blocks()) * lanes, lanes, po + offset + first,
                                        lanes);
            else if (quantize_)
              quantize_floats(result, n, quantize_->scale[0], quantize_->zero_point[0], out_type, po + offset + first);
          }
        }
      };
      const int nt = std::max(1, std::min(threads_for(out.numel()), static_cast<int>(std::min<int64_t>(units, 1 << 20))));
      if (nt <= 1) {
        run_units(0, units);
      } else {
#pragma omp parallel num_threads(nt)
        {
          const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
          if (units * t / T < units * (t + 1) / T) run_units(units * t / T, units * (t + 1) / T);
        }
      }
      ctx.set_output_layout(0, dnnl_kernels::retyped_layout(*plan->out_like, out_type));
      return true;
    } else {
      return false;
    }
  }

  const ir::Node& node_;
  Op op_;
  Broadcast mode_;
  std::optional<LaneQuantizer> lane_quantizer_;  // the folded per-channel Q on channel-blocked data
  std::optional<FoldedQuantize> quantize_;  // a QuantizeLinear the plan folded into this op
  std::optional<FoldedChannelQuantize> channel_quantize_;  // a per-channel one
  std::vector<FoldedDequantize> dequantize_;               // inputs read as 8-bit codes
  int64_t scaled_input_ = -1;  // the operand multiplied by input 2 first (a folded Mul), if any
  Tensor channel_scale_, channel_zero_point_;              // its parameters as tensors (for short slabs)
  int64_t upsampled_input_ = -1;  // the operand read through a folded nearest Resize, if any
  std::vector<int64_t> factors_;   // its {kh, kw}
  Activation act_;
};

// Max, Min, Sum, Mean over 1..N inputs: folds pairwise into the output (which has the broadcast
// shape of all inputs, so each later step reads the output in place).
template <typename Fn>
class VariadicKernel final : public Kernel {
 public:
  VariadicKernel(const KernelInit& init, bool mean) : node_(init.node), mean_(mean) {
    act_ = resolve_fused_activation(node_);
  }

  void run(KernelContext& ctx) override {
    const std::string who = node_.describe();
    const size_t n = ctx.num_inputs();
    std::vector<const Tensor*> ins;
    std::vector<const Shape*> shapes;
    for (size_t i = 0; i < n; ++i) {
      ins.push_back(&ctx.input(i));
      shapes.push_back(&ins.back()->shape());
      check_same_dtype(node_, *ins[0], *ins[i], i);
    }
    SQ_CHECK(!ins.empty(), ErrorKind::kInvalidModel, who + ": needs at least one input");
    const Shape out_shape = broadcast_all(shapes, who);
    if (n == 1 && !act_) {  // identity: share the input's storage
      ctx.set_output(0, *ins[0]);
      return;
    }
    dispatch_dtype(ins[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (kIsNumeric<T>) {
        if (act_ && !std::is_same_v<T, float>)
          fail(ErrorKind::kUnsupported, who + ": fused activation needs float32 data");
        Tensor& out = ctx.allocate_output(0, dtype_of<T>, out_shape);
        const SameTypeOp<NumericP, Fn> op{};
        const Activation none;
        const bool last_applies_act = !mean_;
        if (n == 1) {
          std::memcpy(out.raw(), ins[0]->raw(), out.nbytes());
        } else {
          for (size_t i = 1; i < n; ++i) {
            const Tensor& lhs = i == 1 ? *ins[0] : out;
            const Activation& act = (i + 1 == n && last_applies_act) ? act_ : none;
            broadcast_binary<T, T, T>(lhs, *ins[i], out, op, act, who);
          }
        }
        if (mean_) {
          T* o = out.data<T>();
          const T count = static_cast<T>(n);
          parallel_range(out.numel(), [&](int64_t b, int64_t e) {
            for (int64_t j = b; j < e; ++j) o[j] = div_t(o[j], count);
          });
        }
        if constexpr (std::is_same_v<T, float>) {
          if (act_ && (mean_ || n == 1)) apply_activation(act_, out.data<float>(), out.numel());
        }
      } else {
        fail_dtype(node_, ins[0]->dtype());
      }
    });
  }

 private:
  const ir::Node& node_;
  bool mean_;
  Activation act_;
};

// Pow: base and exponent may have different dtypes; the output has the base's.
template <typename T, typename U>
inline T pow_value(T x, U y) {
  if constexpr (kIsFloat<T>) {
    return std::pow(x, static_cast<T>(y));
  } else if constexpr (kIsFloat<U>) {
    return static_cast<T>(std::pow(static_cast<double>(x), static_cast<double>(y)));
  } else {
    // Integer power by squaring (exact, wrapping); negative exponents truncate like 1 / x^-y.
    if constexpr (std::is_signed_v<U>) {
      if (y < 0) {
        if (x == T(1)) return T(1);
        if constexpr (std::is_signed_v<T>) {
          if (x == T(-1)) return (y % 2 == 0) ? T(1) : T(-1);
        }
        return T(0);
      }
    }
    T result = T(1), base = x;
    for (auto e = static_cast<std::make_unsigned_t<U>>(y); e != 0; e >>= 1) {
      if (e & 1) result = wrap_mul(result, base);
      base = wrap_mul(base, base);
    }
    return result;
  }
}

class PowKernel final : public Kernel {
 public:
  explicit PowKernel(const KernelInit& init) : node_(init.node) { reject_fused_activation(node_); }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& y = ctx.input(1);
    const std::string who = node_.describe();
    const Shape out_shape = broadcast_all({&x.shape(), &y.shape()}, who);
    // Float32 with a scalar exponent: the common x^2 (LayerNorm variance), x^0.5, x^3 become
    // multiplies instead of powf calls.
    if (x.dtype() == DType::kFloat32 && y.numel() == 1 && out_shape == x.shape() &&
        (y.dtype() == DType::kFloat32 || y.dtype() == DType::kFloat64 || y.dtype() == DType::kInt64 ||
         y.dtype() == DType::kInt32)) {
      const double e = y.to_float_vector()[0];
      if (e == 2.0 || e == 3.0 || e == 1.0 || e == 0.5) {
        Tensor& out = ctx.allocate_output(0, DType::kFloat32, out_shape);
        const float* px = x.data<float>();
        float* po = out.data<float>();
        parallel_range(x.numel(), [&](int64_t b, int64_t end) {
          if (e == 2.0) for (int64_t i = b; i < end; ++i) po[i] = px[i] * px[i];
          else if (e == 3.0) for (int64_t i = b; i < end; ++i) po[i] = px[i] * px[i] * px[i];
          else if (e == 1.0) for (int64_t i = b; i < end; ++i) po[i] = px[i];
          else for (int64_t i = b; i < end; ++i) po[i] = std::sqrt(px[i]);
        });
        return;
      }
    }
    // The exponent is read as float64, int64 or uint64: pow_value gives each exponent type's result
    // from its value (a float exponent is rounded to T or computed in double, an integer one is a
    // power by squaring), so three exponent types give every result (one instantiation each instead of one per type).
    SQ_CHECK(y.dtype() != DType::kBool, ErrorKind::kUnsupported,
             who + ": exponent dtype " + dtype_name(y.dtype()) + " is not supported");
    const DType wide = dtype_is_float(y.dtype())                                       ? DType::kFloat64
                       : (y.dtype() == DType::kUInt32 || y.dtype() == DType::kUInt64) ? DType::kUInt64
                                                                                       : DType::kInt64;
    const Tensor exponent = y.dtype() == wide ? y : y.cast(wide);
    dispatch_dtype(x.dtype(), [&](auto xt) {
      using T = decltype(xt);
      if constexpr (kIsFloat<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
        Tensor& out = ctx.allocate_output(0, dtype_of<T>, out_shape);
        auto raise = [&](auto exponent_tag) {
          using U = decltype(exponent_tag);
          broadcast_binary<T, U, T>(x, exponent, out, [](T a, U b) { return pow_value(a, b); }, Activation{}, who);
        };
        if (wide == DType::kFloat64) raise(double{});
        else if (wide == DType::kUInt64) raise(uint64_t{});
        else raise(int64_t{});
      } else {
        fail_dtype(node_, x.dtype());
      }
    });
  }

 private:
  const ir::Node& node_;
};

class WhereKernel final : public Kernel {
 public:
  explicit WhereKernel(const KernelInit& init) : node_(init.node) { reject_fused_activation(node_); }

  void run(KernelContext& ctx) override {
    const Tensor& c = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& y = ctx.input(2);
    const std::string who = node_.describe();
    SQ_CHECK(c.dtype() == DType::kBool, ErrorKind::kInvalidArgument,
             who + ": condition must be bool, got " + dtype_name(c.dtype()));
    check_same_dtype(node_, x, y, 2);
    const Shape out_shape = broadcast_all({&c.shape(), &x.shape(), &y.shape()}, who);
    const BroadcastPlan p = make_broadcast_plan(out_shape, {&c.shape(), &x.shape(), &y.shape()}, who);
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      Tensor& out = ctx.allocate_output(0, dtype_of<T>, out_shape);
      const uint8_t* pc = storage_ptr<bool>(c.raw());
      const Storage<T>* px = storage_ptr<T>(x.raw());
      const Storage<T>* py = storage_ptr<T>(y.raw());
      Storage<T>* po = storage_ptr<T>(out.raw());
      const int64_t sc = p.inner_stride(0), sx = p.inner_stride(1), sy = p.inner_stride(2);
      for_each_row(p, [&](const int64_t* off, int64_t o, int64_t n) {
        const uint8_t* cc = pc + off[0];
        const Storage<T>* xx = px + off[1];
        const Storage<T>* yy = py + off[2];
        Storage<T>* oo = po + o;
        if (sc && sx && sy) {
          for (int64_t i = 0; i < n; ++i) oo[i] = select(cc[i] != 0, xx[i], yy[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) oo[i] = select(cc[i * sc] != 0, xx[i * sx], yy[i * sy]);
        }
      });
    });
  }

 private:
  const ir::Node& node_;
};

struct ModOp {
  template <typename T> static constexpr bool kAccepts = kIsNumeric<T>;
  template <typename T> using Out = T;
  ModFn fn;
  template <typename T> T operator()(T a, T b) const { return fn(a, b); }
};

// Floats only have the C semantics: the spec requires fmod = 1 for them.
class ModKernel final : public Kernel {
 public:
  ModKernel(const KernelInit& init, bool fmod)
      : node_(init.node), fmod_(fmod), inner_(init, ModOp{ModFn{fmod}}, false) {}
  void run(KernelContext& ctx) override {
    if (!fmod_ && dtype_is_float(ctx.input(0).dtype()))
      fail(ErrorKind::kInvalidModel, node_.describe() + ": fmod must be 1 for floating-point inputs");
    inner_.run(ctx);
  }

 private:
  const ir::Node& node_;
  bool fmod_;
  BinaryKernel<ModOp> inner_;
};

template <typename Op>
KernelFactory binary(Op op, bool fusable = false, Broadcast mode = Broadcast::kMulti) {
  return [op, fusable, mode](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<BinaryKernel<Op>>(init, op, fusable, mode);
  };
}

template <typename Fn>
KernelFactory variadic(bool mean) {
  return [mean](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<VariadicKernel<Fn>>(init, mean);
  };
}

// What the arithmetic kernels fold, per node: one upsampled and one scaled operand at most, on
// different sides (each attribute names one input); codes under a scaled operand (x + x * s of a
// squeeze-excitation, the scaling applied after dequantizing) but not under an upsampled one.
bool arithmetic_refuses(const ir::Node& n, Fold fold, int input) {
  const bool scaled = n.attrs.count(kScaledInput);
  if (n.inputs.size() != (scaled ? 3u : 2u)) return true;  // the operands, and a scaled operand's factor
  const int64_t upsampled_side = n.attr_int(kNearestUpsampledInput, -1), scaled_side = n.attr_int(kScaledInput, -1);
  switch (fold) {
    case Fold::kUpsampledInput: return upsampled_side >= 0 || (input >= 0 && input == scaled_side);
    case Fold::kScaledInput: return scaled || (input >= 0 && input == upsampled_side);
    case Fold::kDequantizedInput: return input >= 0 && input == upsampled_side;
    default: return false;
  }
}

// Operands 0 and 1 (a scaled operand's factor, input 2, stays float).
constexpr KernelFolds kAddSubFolds{.dequantized_inputs = 0b11, .scaled_inputs = 0b11, .upsampled_inputs = 0b11,
                                   .tensor_quantize = true, .channel_quantize = true, .refuses = arithmetic_refuses};
constexpr KernelFolds kMulDivFolds{.dequantized_inputs = 0b11, .upsampled_inputs = 0b11, .tensor_quantize = true,
                                   .channel_quantize = true, .refuses = arithmetic_refuses};

}  // namespace

void register_binary_kernels(KernelRegistry& r) {
  r.add("Add", binary(SameTypeOp<NumericP, AddFn>{}, true), "", layouts::kChannelBlockedArithmetic, kAddSubFolds);
  r.add("Sub", binary(SameTypeOp<NumericP, SubFn>{}, true), "", layouts::kChannelBlockedArithmetic, kAddSubFolds);
  r.add("Mul", binary(SameTypeOp<NumericP, MulFn>{}, true), "", layouts::kChannelBlockedArithmetic, kMulDivFolds);
  r.add("Div", binary(SameTypeOp<NumericP, DivFn>{}, true), "", layouts::kChannelBlockedArithmetic, kMulDivFolds);
  r.add("PRelu", binary(SameTypeOp<SignedNumericP, PReluFn>{}, false, Broadcast::kToFirst));
  r.add("Mod", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    const int64_t fmod = init.node.attr_int("fmod", 0);
    SQ_CHECK(fmod == 0 || fmod == 1, ErrorKind::kInvalidModel,
             init.node.describe() + ": fmod must be 0 or 1, got " + std::to_string(fmod));
    return std::make_unique<ModKernel>(init, fmod == 1);
  });
  r.add("BitShift", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    const std::string dir = init.node.attr_string("direction", "");
    SQ_CHECK(dir == "LEFT" || dir == "RIGHT", ErrorKind::kInvalidModel,
             init.node.describe() + ": direction must be LEFT or RIGHT, got '" + dir + "'");
    using Op = SameTypeOp<UnsignedP, BitShiftFn>;
    return std::make_unique<BinaryKernel<Op>>(init, Op{BitShiftFn{dir == "LEFT"}}, false);
  });
  r.add("Pow", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<PowKernel>(init); });

  r.add("Max", variadic<MaxFn>(false));
  r.add("Min", variadic<MinFn>(false));
  r.add("Sum", variadic<AddFn>(false));
  r.add("Mean", variadic<AddFn>(true));

  r.add("Equal", binary(CompareOp<AnyP, EqFn>{}));
  r.add("Less", binary(CompareOp<NumericP, LtFn>{}));
  r.add("Greater", binary(CompareOp<NumericP, GtFn>{}));
  r.add("LessOrEqual", binary(CompareOp<NumericP, LeFn>{}));
  r.add("GreaterOrEqual", binary(CompareOp<NumericP, GeFn>{}));
  r.add("And", binary(SameTypeOp<BoolP, AndFn>{}));
  r.add("Or", binary(SameTypeOp<BoolP, OrFn>{}));
  r.add("Xor", binary(SameTypeOp<BoolP, XorFn>{}));
  r.add("Where", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<WhereKernel>(init); });
}

}  // namespace slimquant::runtime::ew
