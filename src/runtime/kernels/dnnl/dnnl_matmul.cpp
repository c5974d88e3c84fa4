// Gemm and MatMul on oneDNN's matmul primitive (FP32).
//
// Gemm (opsets 1-13): Y = act(alpha * A' * B' + beta * C), A' = transA ? A^T : A, likewise B', C
// broadcast to [M, N]. Transposes are strides in the memory descriptors (no copies). A constant B
// is packed once, with alpha folded in; a constant C is pre-scaled by beta and becomes the
// primitive's bias. Otherwise alpha is an output scale and beta*C a sum post-op over Y pre-filled
// with C.
//
// MatMul (opsets 1-13): numpy semantics. 1-D operands are promoted ([K] -> [1, K] for A,
// [K] -> [K, 1] for B) and the added dim dropped from Y; batch dims broadcast (ranks may differ).
// With a constant 2-D B (a Linear layer's weights) all leading dims of A fold into M: one GEMM with
// the packed weights. A Transpose the plan folded into A or B (Fold::kTransposedInput: attention's
// head splits, K^T) is read through its strides, and one folded into Y (Fold::kTransposedOutput:
// the heads' merge) is written through them; where the primitive cannot take those strides (no
// unit stride in the matrix, rows not one stride apart against a 2-D B, only oneDNN's reference
// kernel, an eltwise pass over Y), the input is transposed into scratch first, or the product
// transposed out of scratch after, the copy the Transpose made. A fused scalar Mul (kScale) is the
// primitive's output scale.
#include <algorithm>
#include <array>
#include <optional>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/fused_ops/transposed_views.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

struct MatmulPlan {
  dnnl::matmul prim;
  memory::desc src, weights, dst, bias;
  Shape out_shape;
  bool fill_c = false;  // Gemm: Y starts as broadcast C, added by the sum post-op
  bool runtime_weights = false;
  memory src_mem, weights_mem, dst_mem, bias_mem, scratchpad_mem;  // bound once, see bind()
  std::unordered_map<int, memory> args;
  // The fused activation run in place on Y when it is not a post-op (see activation_as_post_op).
  std::vector<dnnl::eltwise_forward> activations;
  std::unordered_map<int, memory> activation_args;
  bool gelu_pass = false;  // a plain GELU: ew::gelu_affine_avx512 over Y instead
  // MatMul inputs A and B read through a folded Transpose but copied transposed first (their
  // descriptors then describe the copy): the permutation; empty otherwise.
  std::array<std::vector<int64_t>, 2> copy_perm;
  // A folded output Transpose applied by a copy after the product (product_shape, plain, in
  // scratch) rather than by the dst descriptor's strides.
  bool copy_out = false;
  Shape product_shape;

  // Binds the argument memories; packed: the constant weights, or nullptr for a runtime B.
  void bind(const dnnl::matmul::primitive_desc& pd, PackedWeights* packed, bool with_bias) {
    prim = dnnl::matmul(pd);
    weights = pd.weights_desc();
    src_mem = unbound_memory(src);
    dst_mem = unbound_memory(dst);
    runtime_weights = packed == nullptr;
    weights_mem = packed ? packed->get(weights) : unbound_memory(weights);
    scratchpad_mem = unbound_memory(pd.scratchpad_desc());
    args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights_mem}, {DNNL_ARG_DST, dst_mem},
            {DNNL_ARG_SCRATCHPAD, scratchpad_mem}};
    if (with_bias) {
      bias_mem = unbound_memory(bias);
      args.emplace(DNNL_ARG_BIAS, bias_mem);
    }
    activation_args = {{DNNL_ARG_SRC, dst_mem}, {DNNL_ARG_DST, dst_mem}};
  }

  void run(const Tensor& a, const Tensor* b, const Tensor* bias_tensor, Tensor& y) {
    run(a.raw(), b ? b->raw() : nullptr, bias_tensor ? bias_tensor->raw() : nullptr, y.data<float>(), y.numel());
  }
  // b: runtime weights (unused when packed); bias: nullptr without one; y: `count` floats.
  void run(const void* a, const void* b, const void* bias, float* y, int64_t count) {
    src_mem.set_data_handle(const_cast<void*>(a));
    if (runtime_weights) weights_mem.set_data_handle(const_cast<void*>(b));
    if (bias) bias_mem.set_data_handle(const_cast<void*>(bias));
    dst_mem.set_data_handle(y);
    bind_scratchpad(scratchpad_mem);
    dnnl::stream& s = dnnl_stream();
    prim.execute(s, args);
    for (const dnnl::eltwise_forward& act : activations) act.execute(s, activation_args);
    s.wait();
    if (gelu_pass) ew::gelu_affine_avx512(y, y, count, 1.f, 0.f);
  }
};

// oneDNN 2.6's GEMM-based matmul applies Relu and Clip post-ops in its JIT epilogue, but every other
// eltwise (even LeakyRelu) through a slow path: 2-8x the cost of a separate JIT eltwise pass over Y
// (measured, 1 thread, AVX2). Those run as that separate pass.
bool activation_as_post_op(const ir::Node& node) {
  const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node);
  return f.kind == fused_ops::Activation::kRelu || f.kind == fused_ops::Activation::kClip;
}

// Puts the node's fused activation after the product: into ops, or as p.activations over Y.
void add_activation(const ir::Node& node, dnnl::post_ops& ops, MatmulPlan& p) {
  const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node);
  if (f.kind == fused_ops::Activation::kGelu && !f.has_post_affine() && !f.has_post_clamp() &&
      ew::gelu_pass_available())
    p.gelu_pass = true;
  else if (activation_as_post_op(node)) append_fused_activation(ops, node);
  else p.activations = make_activation_primitives(node, p.dst);
}

// Row-major strides for `dims`.
Dims strides_of(const Dims& dims) {
  Dims s(dims.size());
  int64_t stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = stride;
    stride *= std::max<int64_t>(dims[i], 1);
  }
  return s;
}

// A 2-D matrix of logical dims {rows, cols} stored row-major, or transposed (stored as cols x rows).
memory::desc matrix_desc(int64_t rows, int64_t cols, bool transposed) {
  return memory::desc({rows, cols}, dt::f32, transposed ? Dims{1, rows} : Dims{cols, 1});
}

dnnl::matmul::primitive_desc make_matmul_pd(const ir::Node& node, const memory::desc& src,
                                            const memory::desc& weights, const memory::desc* bias,
                                            const memory::desc& dst, const dnnl::primitive_attr& attr) {
  return make_pd(node, "this matrix multiplication", [&] {
    dnnl::matmul::desc d = bias ? dnnl::matmul::desc(src, weights, *bias, dst) : dnnl::matmul::desc(src, weights, dst);
    return dnnl::matmul::primitive_desc(d, attr, dnnl_engine());
  });
}

// ---------------------------------------------------------------------------------------------
// Gemm


struct GemmAttrs {
  float alpha = 1.f, beta = 1.f;
  bool trans_a = false, trans_b = false;
};

class GemmKernel final : public Kernel {
  enum GemmInput : size_t { kA = 0, kB = 1, kC = 2 };
 public:
  explicit GemmKernel(const KernelInit& init) : node_(init.node) {
    attrs_.alpha = node_.attr_float("alpha", 1.f);
    attrs_.beta = node_.attr_float("beta", 1.f);
    attrs_.trans_a = node_.attr_int("transA", 0) != 0;
    attrs_.trans_b = node_.attr_int("transB", 0) != 0;
    check_fused_activation(node_);
    if (const Tensor* b = init.constant_input(kB)) {
      require_float32(node_, *b, "input B");
      if (b->rank() != 2)
        fail(ErrorKind::kInvalidModel,
             node_.describe() + ": input B of shape " + shape_str(b->shape()) + " must be 2-D");
      const_b_shape_ = b->shape();
      Tensor packed_source = *b;
      if (attrs_.alpha != 1.f) {  // fold alpha into the weights once instead of scaling every output
        packed_source = b->clone();
        for (float& v : packed_source.values<float>()) v *= attrs_.alpha;
      }
      const int64_t k = attrs_.trans_b ? b->dim(1) : b->dim(0), n = attrs_.trans_b ? b->dim(0) : b->dim(1);
      packed_b_.set_source(packed_source, matrix_desc(k, n, attrs_.trans_b));
    }
    has_c_ = node_.inputs.size() > kC && !node_.inputs[kC].empty() && attrs_.beta != 0.f;
    if (has_c_)
      if (const Tensor* c = init.constant_input(kC)) {
        require_float32(node_, *c, "input C");
        const_c_ = c->clone();
        if (attrs_.beta != 1.f)
          for (float& v : const_c_.values<float>()) v *= attrs_.beta;
      }
  }

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(kA);
    require_float32(node_, a, "input A");
    const Tensor* b = packed_b_.has_source() ? nullptr : &ctx.input(kB);
    if (b) require_float32(node_, *b, "input B");
    const Tensor* c = nullptr;
    if (has_c_) {
      c = const_c_.defined() ? &const_c_ : &ctx.input(kC);
      require_float32(node_, *c, "input C");
    }
    const Shape& bs = b ? b->shape() : const_b_shape_;
    MatmulPlan& p = plans_.get({&a.shape(), &bs, c ? &c->shape() : nullptr},
                               [&] { return make_plan(a.shape(), bs, c ? &c->shape() : nullptr); });
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, p.out_shape);
    if (y.numel() == 0) return;
    if (p.fill_c) fill_broadcast(*c, y);
    p.run(a, b, p.fill_c ? nullptr : c, y);
  }

 private:
  // C viewed as 2-D {rows, cols}, each 1 or the matching dim of Y (unidirectional broadcast).
  Dims c_dims(const Shape& cs, int64_t m, int64_t n) const {
    Dims d = cs.size() == 0 ? Dims{1, 1} : cs.size() == 1 ? Dims{1, cs[0]} : Dims{cs[0], cs[1]};
    if (cs.size() > 2 || (d[0] != 1 && d[0] != m) || (d[1] != 1 && d[1] != n))
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": input C of shape " + shape_str(cs) +
                                            " does not broadcast to [" + std::to_string(m) + "x" +
                                            std::to_string(n) + "]");
    return d;
  }

  void fill_broadcast(const Tensor& c, Tensor& y) const {
    const int64_t m = y.dim(0), n = y.dim(1);
    const Dims cd = c_dims(c.shape(), m, n);
    const float* src = c.data<float>();
    float* dst = y.data<float>();
    for (int64_t i = 0; i < m; ++i) {
      const float* row = src + (cd[0] == 1 ? 0 : i * cd[1]);
      float* out = dst + i * n;
      if (cd[1] == 1) std::fill(out, out + n, row[0]);
      else std::copy(row, row + n, out);
    }
  }

  MatmulPlan make_plan(const Shape& as, const Shape& bs, const Shape* cs) {
    const std::string what = node_.describe();
    if (as.size() != 2 || bs.size() != 2)
      fail(ErrorKind::kInvalidArgument, what + ": inputs A " + shape_str(as) + " and B " + shape_str(bs) +
                                            " must be 2-D");
    const int64_t m = attrs_.trans_a ? as[1] : as[0], k = attrs_.trans_a ? as[0] : as[1];
    const int64_t kb = attrs_.trans_b ? bs[1] : bs[0], n = attrs_.trans_b ? bs[0] : bs[1];
    if (k != kb)
      fail(ErrorKind::kInvalidArgument, what + ": inner dimensions differ: A' is " + std::to_string(m) + "x" +
                                            std::to_string(k) + ", B' is " + std::to_string(kb) + "x" +
                                            std::to_string(n));
    MatmulPlan p;
    p.out_shape = {m, n};
    // No rows (a detector's box head after a selection kept nothing): nothing to run, and oneDNN
    // 2.6 divides by zero creating the primitive.
    if (m == 0 || n == 0) return p;
    if (k == 0) fail(ErrorKind::kUnsupported, what + ": inputs A and B have an inner dimension of 0");
    p.src = matrix_desc(m, k, attrs_.trans_a);
    p.dst = plain_desc(p.out_shape);
    const bool const_b = packed_b_.has_source();
    // A runtime C becomes the bias only when nothing needs scaling around it; otherwise Y is
    // pre-filled with C and the sum post-op adds beta * C after alpha scaled the product.
    const Dims cd = cs ? c_dims(*cs, m, n) : Dims{};  // validates the broadcast
    const bool c_as_bias = cs && (const_c_.defined() || attrs_.beta == 1.f) && (const_b || attrs_.alpha == 1.f);
    p.fill_c = cs && !c_as_bias;
    const float output_scale = const_b ? 1.f : attrs_.alpha;
    dnnl::primitive_attr attr = base_attr();
    if (output_scale != 1.f) attr.set_output_scales(0, {output_scale});
    dnnl::post_ops ops;
    if (p.fill_c) ops.append_sum(const_c_.defined() ? 1.f : attrs_.beta);  // a constant C is pre-scaled
    add_activation(node_, ops, p);
    attr.set_post_ops(ops);
    if (c_as_bias) p.bias = memory::desc(cd, dt::f32, memory::format_tag::ab);
    memory::desc wei_md = const_b ? memory::desc({k, n}, dt::f32, memory::format_tag::any)
                                  : matrix_desc(k, n, attrs_.trans_b);
    auto pd = make_matmul_pd(node_, p.src, wei_md, c_as_bias ? &p.bias : nullptr, p.dst, attr);
    p.bind(pd, const_b ? &packed_b_ : nullptr, c_as_bias);
    return p;
  }

  const ir::Node node_;
  GemmAttrs attrs_;
  Shape const_b_shape_;
  PackedWeights packed_b_;
  bool has_c_ = false;
  Tensor const_c_;  // beta * C when C is constant
  ShapeCache<MatmulPlan> plans_;
};

// ---------------------------------------------------------------------------------------------
// MatMul

class MatMulKernel final : public Kernel {
 public:
  explicit MatMulKernel(const KernelInit& init) : node_(init.node) {
    check_fused_activation(node_);
    out_perm_ = fused_ops::transposed_output_perm(node_).value_or(std::vector<int64_t>{});
    for (size_t k = 0; k < 2; ++k) {
      perm_[k] = fused_ops::transposed_input_perm(node_, k).value_or(std::vector<int64_t>{});
      if (!perm_[k].empty() && init.constant_input(k))
        fail(ErrorKind::kInvalidModel, node_.describe() + ": a transposed input must not be a constant");
    }
    if (const Tensor* b = init.constant_input(1)) {
      require_float32(node_, *b, "input B");
      const_b_shape_ = b->shape();
      if (b->rank() >= 2) packed_b_.set_source(*b, plain_desc(b->shape()));
      else const_b_vector_ = *b;  // a 1-D B is a matrix-vector product: nothing worth packing
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    require_float32(node_, a, "input A");
    const Tensor* b = packed_b_.has_source() ? nullptr : const_b_vector_.defined() ? &const_b_vector_ : &ctx.input(1);
    if (b) require_float32(node_, *b, "input B");
    const Shape& bs = b ? b->shape() : const_b_shape_;
    // Input 2 (not ONNX): the [N] bias of a following Add the plan fused in (session.cpp).
    const Tensor* bias = ctx.optional_input(kFusedBias);
    if (bias) require_float32(node_, *bias, "the fused bias");
    MatmulPlan& p = plans_.get({&a.shape(), &bs, bias ? &bias->shape() : nullptr},
                               [&] { return make_plan(a.shape(), bs, bias ? &bias->shape() : nullptr); });
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, p.out_shape);
    if (y.numel() == 0) return;
    // Inputs whose folded Transpose the primitive cannot read through: transposed into scratch.
    const void* data[2] = {a.raw(), b ? b->raw() : nullptr};
    const Tensor* stored[2] = {&a, b};
    for (size_t k = 0; k < 2; ++k) {
      if (p.copy_perm[k].empty()) continue;
      void* copy = dnnl_scratch(k == 0 ? DnnlScratch::kSrc : DnnlScratch::kWeights, stored[k]->nbytes());
      shape::transpose_bytes(copy, data[k], stored[k]->shape(), p.copy_perm[k], sizeof(float));
      data[k] = copy;
    }
    float* out = p.copy_out ? static_cast<float*>(dnnl_scratch(DnnlScratch::kDst, y.nbytes())) : y.data<float>();
    p.run(data[0], data[1], bias ? bias->raw() : nullptr, out, y.numel());
    if (p.copy_out) shape::transpose_bytes(y.raw(), out, p.product_shape, out_perm_, sizeof(float));
  }

 private:
  static constexpr size_t kFusedBias = 2;

  // as, bs: the inputs as stored (before a folded Transpose).
  MatmulPlan make_plan(const Shape& as_stored, const Shape& bs_stored, const Shape* bias) {
    const std::string what = node_.describe();
    for (size_t k = 0; k < 2; ++k)
      if (!perm_[k].empty() && perm_[k].size() != (k == 0 ? as_stored : bs_stored).size())
        fail(ErrorKind::kInvalidArgument, what + ": input " + std::to_string(k) + " of shape " +
                                              shape_str(k == 0 ? as_stored : bs_stored) +
                                              " does not fit the folded Transpose's permutation");
    // The logical inputs and the element strides reading them from the stored tensors.
    const Shape as = permuted(as_stored, perm_[0]), bs = permuted(bs_stored, perm_[1]);
    const Dims a_strides = permuted(strides_of(as_stored), perm_[0]), b_strides = permuted(strides_of(bs_stored), perm_[1]);
    if (as.empty() || bs.empty())
      fail(ErrorKind::kInvalidArgument, what + ": inputs must have rank >= 1, got A " + shape_str(as) + " and B " +
                                            shape_str(bs));
    // Promote 1-D operands to matrices.
    Shape a2 = as, b2 = bs;
    if (a2.size() == 1) a2.insert(a2.begin(), 1);
    if (b2.size() == 1) b2.push_back(1);
    const int64_t m = a2[a2.size() - 2], k = a2.back(), kb = b2[b2.size() - 2], n = b2.back();
    if (k != kb)
      fail(ErrorKind::kInvalidArgument, what + ": inner dimensions differ: A " + shape_str(as) + ", B " +
                                            shape_str(bs));
    const Shape a_batch(a2.begin(), a2.end() - 2), b_batch(b2.begin(), b2.end() - 2);
    Shape out_batch;
    try {
      out_batch = broadcast_shapes(a_batch, b_batch);
    } catch (const Error&) {
      fail(ErrorKind::kInvalidArgument, what + ": batch dims of A " + shape_str(as) + " and B " + shape_str(bs) +
                                            " do not broadcast");
    }
    MatmulPlan p;
    p.product_shape = out_batch;
    if (as.size() > 1) p.product_shape.push_back(m);
    if (bs.size() > 1) p.product_shape.push_back(n);
    if (!out_perm_.empty() && out_perm_.size() != p.product_shape.size())
      fail(ErrorKind::kInvalidArgument, what + ": the product " + shape_str(p.product_shape) +
                                            " does not fit the folded output Transpose's permutation");
    p.out_shape = permuted(p.product_shape, out_perm_);  // y's shape
    // The product's dims as strides into y.
    Dims product_strides(p.product_shape.size());
    if (!out_perm_.empty()) {
      const Dims y_strides = strides_of(p.out_shape);
      for (size_t j = 0; j < out_perm_.size(); ++j) product_strides[static_cast<size_t>(out_perm_[j])] = y_strides[j];
    }
    if (shape_numel(p.out_shape) == 0) return p;  // nothing to run (see GemmKernel::make_plan)
    if (k == 0) fail(ErrorKind::kUnsupported, what + ": inputs A and B have an inner dimension of 0");

    const bool const_b = packed_b_.has_source();
    Dims src_dims, wei_dims, dst_dims;
    if (b_batch.empty()) {
      // B is one matrix: all of A's leading dims fold into M (one GEMM, packed weights reused).
      src_dims = {shape_numel(a_batch) * m, k};
      wei_dims = {k, n};
      dst_dims = {shape_numel(a_batch) * m, n};
    } else {
      const size_t r = out_batch.size() + 2;
      if (r > DNNL_MAX_NDIMS)
        fail(ErrorKind::kUnsupported, what + ": rank " + std::to_string(r) + " exceeds oneDNN's limit of " +
                                          std::to_string(DNNL_MAX_NDIMS));
      auto padded = [&](const Shape& batch, int64_t rows, int64_t cols) {
        Dims d(r - 2 - batch.size(), 1);
        d.insert(d.end(), batch.begin(), batch.end());
        d.push_back(rows);
        d.push_back(cols);
        return d;
      };
      src_dims = padded(a_batch, m, k);
      wei_dims = padded(b_batch, k, n);
      dst_dims = padded(out_batch, m, n);
    }
    // A transposed input's strides, where the primitive can take them: as src_dims / wei_dims
    // (1-D promotion and leading 1s add size-1 dims, whose stride does not matter).
    auto view_strides = [](const Dims& dims, const Shape& logical, const Dims& strides) -> std::optional<Dims> {
      Dims out(dims.size(), 0);
      // Align the logical dims to the right end, the 2-D case by collapsing all but the last.
      if (dims.size() == 2 && logical.size() > 2) {
        // Rows one stride apart: each non-1 dim before the last steps over the next one's extent.
        int64_t row_stride = -1, expect = -1;
        for (size_t d = logical.size() - 1; d-- > 0;) {
          if (logical[d] == 1) continue;
          if (row_stride < 0) row_stride = strides[d];
          else if (strides[d] != expect) return std::nullopt;
          expect = strides[d] * logical[d];
        }
        out = {row_stride < 0 ? 1 : row_stride, strides.back()};
      } else {
        const size_t shift = dims.size() - logical.size();  // leading 1s, or 0
        for (size_t d = 0; d < logical.size(); ++d) out[shift + d] = strides[d];
        for (size_t d = 0; d < shift; ++d) out[d] = 1;
      }
      // oneDNN's matmul needs one of the matrix dims contiguous.
      const size_t r = out.size();
      if (out[r - 1] != 1 && out[r - 2] != 1 && dims[r - 1] != 1 && dims[r - 2] != 1) return std::nullopt;
      return out;
    };
    auto make = [&](bool use_views) {
      MatmulPlan q = p;
      // Views need both operands to be matrices (a 1-D operand's promotion adds a dim the
      // permutation does not know).
      const bool views = use_views && as.size() > 1 && bs.size() > 1;
      const std::optional<Dims> sa = views && !perm_[0].empty() ? view_strides(src_dims, as, a_strides) : std::nullopt;
      const std::optional<Dims> sb = views && !perm_[1].empty() ? view_strides(wei_dims, bs, b_strides) : std::nullopt;
      const std::optional<Dims> sd =
          views && !out_perm_.empty() ? view_strides(dst_dims, p.product_shape, product_strides) : std::nullopt;
      if (!perm_[0].empty() && !sa) q.copy_perm[0] = perm_[0];
      if (!perm_[1].empty() && !sb) q.copy_perm[1] = perm_[1];
      q.copy_out = !out_perm_.empty() && !sd;
      q.src = memory::desc(src_dims, dt::f32, sa ? *sa : strides_of(src_dims));
      q.dst = memory::desc(dst_dims, dt::f32, sd ? *sd : strides_of(dst_dims));
      dnnl::primitive_attr attr = base_attr();
      dnnl::post_ops ops;
      // A scalar Mul after the product (attention's 1 / sqrt(d)) is the primitive's output scale,
      // free in its epilogue, where an eltwise pass over Y cost attention at vit_small's sizes 0.03
      // ms a call. With a bias it stays a pass: the Mul scales the sum, bias included.
      const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node_);
      if (f.kind == fused_ops::Activation::kScale && !f.has_post_affine() && !f.has_post_clamp() && !bias)
        attr.set_output_scales(0, {f.alpha});
      else add_activation(node_, ops, q);
      // oneDNN's eltwise passes over a strided dst: copied instead.
      if (sd && !q.activations.empty()) return std::optional<MatmulPlan>{};
      attr.set_post_ops(ops);
      memory::desc wei_md = const_b ? memory::desc(wei_dims, dt::f32, memory::format_tag::any)
                                    : memory::desc(wei_dims, dt::f32, sb ? *sb : strides_of(wei_dims));
      if (bias) {
        if (!b_batch.empty() || bias->size() != 1 || (*bias)[0] != n || bs.size() < 2)
          fail(ErrorKind::kInternal, what + ": fused bias " + shape_str(*bias) + " needs a 2-D B with " +
                                         std::to_string(n) + " columns, B is " + shape_str(bs));
        Dims bias_dims(dst_dims.size(), 1);
        bias_dims.back() = n;
        q.bias = memory::desc(bias_dims, dt::f32, strides_of(bias_dims));
      }
      auto pd = make_matmul_pd(node_, q.src, wei_md, bias ? &q.bias : nullptr, q.dst, attr);
      const bool viewed = sa || sb || sd;
      if (viewed && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return std::optional<MatmulPlan>{};
      q.bind(pd, const_b ? &packed_b_ : nullptr, bias != nullptr);
      return std::optional<MatmulPlan>{std::move(q)};
    };
    if (perm_[0].empty() && perm_[1].empty() && out_perm_.empty()) return *make(false);
    // Through the strides where oneDNN takes them with a real kernel, else from transposed copies.
    try {
      if (std::optional<MatmulPlan> viewed = make(true)) return std::move(*viewed);
    } catch (const Error&) {
    }
    return *make(false);
  }

  // dims[perm[d]] for each d (no perm: dims).
  template <class V>
  static V permuted(const V& dims, const std::vector<int64_t>& perm) {
    if (perm.empty()) return dims;
    V out(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) out[d] = dims[static_cast<size_t>(perm[d])];
    return out;
  }

  const ir::Node node_;
  std::array<std::vector<int64_t>, 2> perm_;  // a Transpose folded into A / B (empty: none)
  std::vector<int64_t> out_perm_;              // a Transpose folded into Y (empty: none)
  Shape const_b_shape_;
  PackedWeights packed_b_;
  Tensor const_b_vector_;
  ShapeCache<MatmulPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_gemm(const KernelInit& init) { return std::make_unique<GemmKernel>(init); }
std::unique_ptr<Kernel> make_matmul(const KernelInit& init) { return std::make_unique<MatMulKernel>(init); }

}  // namespace slimquant::runtime::dnnl_kernels
