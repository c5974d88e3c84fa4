#include "runtime/kernels/integer/int8_conv_bands.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "runtime/dnnl_context.h"
#include "runtime/kernels/elementwise/swish_avx512.h"

namespace slimquant::runtime::int8 {

using dnnl::memory;

bool gated_output_stage(const QLinearAttrs& q, GatedOutputStage& stage) {
  const bool hard_swish = q.activation == Activation::kHardSwish;
  if (q.activation != Activation::kSwish && !hard_swish) return false;
  stage.gate = hard_swish ? ew::Gate::kHardSwish : ew::Gate::kSwish;
  stage.alpha = q.activation_alpha;
  stage.y_type = q.y.dtype;
  stage.factor.clear();
  stage.offset.clear();
  // As make_post_ops: the post affine map, 1 / s_y and z_y in one multiply-add (z_y is 0 for a
  // per-channel y; a float32 y has s_y 1 and z_y 0).
  for (size_t c = 0; c < q.y.scale.size(); ++c) {
    const float inv = 1.f / q.y.scale[c];
    stage.factor.push_back(q.post_scale * inv);
    stage.offset.push_back(q.post_shift * inv + static_cast<float>(q.y.per_tensor() ? q.y.zero_point[0] : 0));
  }
  return true;
}

ConvBands::ConvBands(const ConvProblem& p, const memory::desc& weights_any, PackedConstant& weights,
                     const memory& bias, const Requant& r, int32_t x_zero_point, GatedOutputStage stage,
                     int64_t band_bytes)
    : problem_(p), stage_(std::move(stage)) {
  if (p.in_spatial.size() != 2 || x_zero_point < 0 || x_zero_point > 255) return;
  const int64_t h = p.in_spatial[0], w = p.in_spatial[1], oh = p.out_spatial[0], ow = p.out_spatial[1];
  const int64_t c = p.in_channels, m = p.out_channels;
  // The rows and columns one output reads (its dilated window).
  const int64_t span_h = (p.kernel[0] - 1) * p.dilations[0] + 1, span_w = (p.kernel[1] - 1) * p.dilations[1] + 1;
  const int64_t sh = p.strides[0], sw = p.strides[1], pt = p.pad_begin[0], pl = p.pad_begin[1];
  // Right padding as the outputs need it; negative (input columns no output reads) is not cut here.
  const int64_t pr = (ow - 1) * sw + span_w - w - pl;
  if (pr < 0 || oh < 1 || ow < 1) return;

  const int64_t row_bytes = ow * m * static_cast<int64_t>(sizeof(float));
  const int64_t image_bytes = oh * row_bytes;
  // Whole images per band when one image's output fits, several when their input rows are all
  // read (then the images are one dense block); else rows of one image.
  const bool whole_images = image_bytes <= band_bytes;
  const bool reads_every_row = (oh - 1) * sh + span_h - pt >= h;
  const int64_t images = whole_images && reads_every_row ? std::clamp<int64_t>(band_bytes / image_bytes, 1, p.batch) : 1;
  const int64_t rows = whole_images ? oh : std::clamp<int64_t>(band_bytes / row_bytes, 1, oh);

  const memory::dims dilations{p.dilations[0] - 1, p.dilations[1] - 1};
  const memory::dims strides{sh, sw};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (r.per_channel) attr.set_output_scales(1 << 1, r.multiplier);
  else attr.set_output_scales(0, {r.multiplier.at(0)});
  attr.set_zero_points(DNNL_ARG_SRC, 0, {x_zero_point});
  const auto nhwc = memory::format_tag::acdb;

  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, int64_t> variant_of;
  using cf = dnnl::convolution_forward;
  try {
    for (int64_t n0 = 0; n0 < p.batch; n0 += images) {
      const int64_t count = std::min(images, p.batch - n0);
      for (int64_t r0 = 0; r0 < oh; r0 += rows) {
        const int64_t r1 = std::min(oh, r0 + rows);
        const int64_t start = r0 * sh - pt, end = (r1 - 1) * sh - pt + span_h;
        const int64_t in_lo = std::max<int64_t>(0, start), in_hi = std::min(h, end);
        if (in_hi <= in_lo) return;  // a band of padding only
        const auto key = std::make_tuple(count, in_hi - in_lo, r1 - r0, in_lo - start, end - in_hi);
        auto [it, added] = variant_of.emplace(key, static_cast<int64_t>(variants_.size()));
        if (added) {
          const memory::desc src_md({count, c, in_hi - in_lo, w}, dt::u8, nhwc);
          const memory::desc dst_md({count, m, r1 - r0, ow}, dt::f32, nhwc);
          const memory::dims pad_l{in_lo - start, pl}, pad_r{end - in_hi, pr};
          const auto pk = dnnl::prop_kind::forward_inference;
          const auto alg = dnnl::algorithm::convolution_direct;
          const cf::desc d = bias ? cf::desc(pk, alg, src_md, weights_any, bias.get_desc(), dst_md, strides, dilations,
                                             pad_l, pad_r)
                                  : cf::desc(pk, alg, src_md, weights_any, dst_md, strides, dilations, pad_l, pad_r);
          const cf::primitive_desc pd(d, attr, dnnl_engine());
          if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return;
          Variant v;
          v.prim = cf(pd);
          v.src = memory(pd.src_desc(), dnnl_engine(), DNNL_MEMORY_NONE);
          v.dst = memory(pd.dst_desc(), dnnl_engine(), DNNL_MEMORY_NONE);
          v.weights = weights.get(pd.weights_desc());
          v.scratchpad = memory(pd.scratchpad_desc(), dnnl_engine(), DNNL_MEMORY_NONE);
          v.args = {{DNNL_ARG_SRC, v.src}, {DNNL_ARG_WEIGHTS, v.weights}, {DNNL_ARG_DST, v.dst},
                    {DNNL_ARG_SCRATCHPAD, v.scratchpad}};
          if (bias) v.args.emplace(DNNL_ARG_BIAS, bias);
          scratchpad_bytes_ = std::max<int64_t>(scratchpad_bytes_, static_cast<int64_t>(pd.scratchpad_desc().get_size()));
          band_values_ = std::max(band_values_, count * (r1 - r0) * ow * m);
          // The primitive must take the dense channels-last layouts asked for (the pointers below
          // assume them).
          if (pd.src_desc() != src_md || pd.dst_desc() != dst_md) return;
          variants_.push_back(std::move(v));
        }
        bands_.push_back({n0, r0, in_lo, it->second});
      }
    }
  } catch (const dnnl::error&) {
    return;  // no implementation of some band on this CPU
  }
  usable_ = true;
}

void ConvBands::run(const uint8_t* x, void* y) {
  const ConvProblem& p = problem_;
  const int64_t h = p.in_spatial[0], w = p.in_spatial[1], oh = p.out_spatial[0], ow = p.out_spatial[1];
  const int64_t c = p.in_channels, m = p.out_channels;
  // A float32 y is the band itself (the pass runs in place while it is in cache).
  const bool float_y = stage_.y_type == DType::kFloat32;
  auto* scratch = float_y ? nullptr
                          : static_cast<float*>(dnnl_scratch(DnnlScratch::kAux, static_cast<size_t>(band_values_) * sizeof(float)));
  void* scratchpad = scratchpad_bytes_ > 0 ? dnnl_scratch(DnnlScratch::kScratchpad, static_cast<size_t>(scratchpad_bytes_))
                                           : nullptr;
  const int64_t channels = static_cast<int64_t>(stage_.factor.size());
  const auto y_size = static_cast<int64_t>(dtype_size(stage_.y_type));
  dnnl::stream& s = dnnl_stream();
  for (const Band& b : bands_) {
    Variant& v = variants_[static_cast<size_t>(b.variant)];
    void* out = static_cast<uint8_t*>(y) + (b.image * oh + b.row) * ow * m * y_size;
    float* band = float_y ? static_cast<float*>(out) : scratch;
    v.src.set_data_handle(const_cast<uint8_t*>(x) + (b.image * h + b.input_row) * w * c);
    v.dst.set_data_handle(band);
    if (scratchpad) v.scratchpad.set_data_handle(scratchpad);
    v.prim.execute(s, v.args);
    s.wait();
    const auto values = static_cast<int64_t>(v.dst.get_desc().get_size() / sizeof(float));
    ew::gated_output_avx512(stage_.gate, band, out, stage_.y_type, values, stage_.alpha, channels,
                            stage_.factor.data(), stage_.offset.data());
  }
}

}  // namespace slimquant::runtime::int8
