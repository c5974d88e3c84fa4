// GridSample (opset 16, and opset 20's 'linear' / 'cubic' spellings for 2-D images): samples X
// [N, C, H, W] at the normalised (x, y) locations of grid [N, H_out, W_out, 2].
//
// GridSample-16 is PyTorch's grid_sample, and this follows PyTorch's CPU kernel:
//   - unnormalise: align_corners maps -1 / 1 to the centres of the corner pixels, otherwise to
//     their outer edges;
//   - bilinear and nearest pad the continuous coordinate first (border: clip to the image,
//     reflection: reflect about the edges - pixel centres with align_corners, pixel edges
//     without - then clip), then read their taps, out-of-image taps reading 0; nearest rounds
//     halves to even (std::nearbyint);
//   - bicubic (Keys, a = -0.75) takes the 4x4 taps around the unpadded coordinate and pads each
//     tap's integer coordinate the same way.
// The taps and weights of a block of output points are computed once and applied to every channel.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/detection/detection_kernels.h"

namespace slimquant::runtime::detection {

namespace {

enum class GridSampleInput : size_t { kX, kGrid };
constexpr size_t slot(GridSampleInput i) { return static_cast<size_t>(i); }

enum class Interpolation { kNearest, kBilinear, kBicubic };
enum class Padding { kZeros, kBorder, kReflection };

// Coordinates beyond this are clamped before float -> int conversion (which is undefined for
// huge values); at that magnitude a float has no fractional part left to interpolate with.
constexpr float kFarCoordinate = 16777216.f;  // 2^24

// Output points whose taps are planned together: the plan of a block stays in cache while every
// channel is sampled with it.
constexpr int64_t kPointsPerBlock = 1024;

// Work (taps times channels) below which the kernel stays on the calling thread.
constexpr int64_t kGridSampleParallelWork = 1 << 16;

float unnormalize(float coord, int64_t size, bool align_corners) {
  const float s = static_cast<float>(size);
  return align_corners ? (coord + 1) / 2 * (s - 1) : ((coord + 1) * s - 1) / 2;
}

// NaN goes far outside the image (PyTorch's convention for non-finite coordinates); infinities
// and huge values are clamped where int conversion is defined.
float sanitize(float x) { return std::isnan(x) ? -100.f : std::clamp(x, -kFarCoordinate, kFarCoordinate); }

// Reflects x into [twice_low / 2, twice_high / 2] (bounds given doubled so they stay integers).
float reflect(float x, float twice_low, float twice_high) {
  if (twice_low == twice_high) return 0.f;
  const float low = twice_low / 2, span = (twice_high - twice_low) / 2;
  x = std::fabs(x - low);
  const float extra = std::fmod(x, span);
  const int64_t flips = static_cast<int64_t>(std::floor(x / span));
  return flips % 2 == 0 ? extra + low : span - extra + low;
}

// Applies border / reflection padding to a coordinate; zeros padding leaves it as it is.
float pad(float x, int64_t size, Padding padding, bool align_corners) {
  if (padding == Padding::kZeros) return x;
  const float last = static_cast<float>(size - 1);
  if (padding == Padding::kReflection)
    x = align_corners ? reflect(x, 0.f, 2 * last) : reflect(x, -1.f, 2 * last + 1);
  return std::clamp(x, 0.f, last);
}

// Keys' cubic convolution weights for taps at floor(x) - 1 .. floor(x) + 2, t = x - floor(x).
void cubic_weights(float t, float* w) {
  constexpr float a = -0.75f;
  auto near = [](float d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // |d| <= 1
  auto far = [](float d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1 < |d| < 2
  w[0] = far(t + 1);
  w[1] = near(t);
  w[2] = near(1 - t);
  w[3] = far(2 - t);
}

struct GridSampleAttrs {
  Interpolation mode = Interpolation::kBilinear;
  Padding padding = Padding::kZeros;
  bool align_corners = false;
};

// The taps of a block of output points, kTaps per point: plane offsets (-1: outside the image,
// reads 0) and weights.
struct TapBlock {
  std::vector<int64_t> offset;
  std::vector<float> weight;
};

template <int kTaps>
void plan_block(const GridSampleAttrs& a, const float* grid, int64_t count, int64_t height, int64_t width,
                TapBlock& plan) {
  plan.offset.resize(static_cast<size_t>(count * kTaps));
  plan.weight.resize(static_cast<size_t>(count * kTaps));
  auto inside = [&](int64_t yy, int64_t xx) { return yy >= 0 && yy < height && xx >= 0 && xx < width; };
  for (int64_t p = 0; p < count; ++p) {
    int64_t* off = plan.offset.data() + p * kTaps;
    float* w = plan.weight.data() + p * kTaps;
    float x = sanitize(unnormalize(grid[2 * p], width, a.align_corners));
    float y = sanitize(unnormalize(grid[2 * p + 1], height, a.align_corners));
    if constexpr (kTaps == 16) {  // bicubic: pad each tap, not the coordinate
      const float fx = std::floor(x), fy = std::floor(y);
      float wx[4], wy[4];
      cubic_weights(x - fx, wx);
      cubic_weights(y - fy, wy);
      for (int i = 0; i < 4; ++i) {
        const int64_t yy = static_cast<int64_t>(pad(fy - 1 + static_cast<float>(i), height, a.padding, a.align_corners));
        for (int j = 0; j < 4; ++j) {
          const int64_t xx = static_cast<int64_t>(pad(fx - 1 + static_cast<float>(j), width, a.padding, a.align_corners));
          off[4 * i + j] = inside(yy, xx) ? yy * width + xx : -1;
          w[4 * i + j] = wy[i] * wx[j];
        }
      }
    } else {
      x = pad(x, width, a.padding, a.align_corners);
      y = pad(y, height, a.padding, a.align_corners);
      if constexpr (kTaps == 1) {
        const int64_t xx = static_cast<int64_t>(std::nearbyint(x)), yy = static_cast<int64_t>(std::nearbyint(y));
        off[0] = inside(yy, xx) ? yy * width + xx : -1;
        w[0] = 1.f;
      } else {
        const float fx = std::floor(x), fy = std::floor(y);
        const float tx = x - fx, ty = y - fy;
        const int64_t x0 = static_cast<int64_t>(fx), y0 = static_cast<int64_t>(fy);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) {
            const int64_t yy = y0 + i, xx = x0 + j;
            off[2 * i + j] = inside(yy, xx) ? yy * width + xx : -1;
            w[2 * i + j] = (i ? ty : 1 - ty) * (j ? tx : 1 - tx);
          }
      }
    }
  }
}

// out[p] = sum of weight * plane[offset] over the taps of point p; outside taps add nothing (a
// select, not a multiply by 0, so an infinite edge pixel does not turn them into NaN).
template <int kTaps>
void apply_block(const TapBlock& plan, int64_t count, const float* plane, float* out) {
  const int64_t* off = plan.offset.data();
  const float* w = plan.weight.data();
  for (int64_t p = 0; p < count; ++p, off += kTaps, w += kTaps) {
    float acc = 0.f;
    for (int k = 0; k < kTaps; ++k) {
      const float v = plane[std::max<int64_t>(off[k], 0)];
      acc += off[k] >= 0 ? w[k] * v : 0.f;
    }
    out[p] = acc;
  }
}

class GridSampleKernel : public Kernel {
 public:
  explicit GridSampleKernel(const KernelInit& init) {
    const ir::Node& node = init.node;
    const std::string mode = node.attr_string("mode", "bilinear");
    if (mode == "bilinear" || mode == "linear") a_.mode = Interpolation::kBilinear;
    else if (mode == "nearest") a_.mode = Interpolation::kNearest;
    else if (mode == "bicubic" || mode == "cubic") a_.mode = Interpolation::kBicubic;
    else fail(ErrorKind::kInvalidModel, node.describe() + ": mode must be bilinear, nearest or bicubic, got '" + mode + "'");
    const std::string padding = node.attr_string("padding_mode", "zeros");
    if (padding == "zeros") a_.padding = Padding::kZeros;
    else if (padding == "border") a_.padding = Padding::kBorder;
    else if (padding == "reflection") a_.padding = Padding::kReflection;
    else
      fail(ErrorKind::kInvalidModel,
           node.describe() + ": padding_mode must be zeros, border or reflection, got '" + padding + "'");
    a_.align_corners = node.attr_int("align_corners", 0) != 0;
  }

  void run(KernelContext& ctx) override {
    switch (a_.mode) {
      case Interpolation::kNearest: return sample<1>(ctx);
      case Interpolation::kBilinear: return sample<4>(ctx);
      case Interpolation::kBicubic: return sample<16>(ctx);
    }
  }

 private:
  template <int kTaps>
  void sample(KernelContext& ctx) const {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(slot(GridSampleInput::kX));
    const Tensor& grid = ctx.input(slot(GridSampleInput::kGrid));
    for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&x, "X"}, {&grid, "grid"}})
      if (t->dtype() != DType::kFloat32)
        fail(ErrorKind::kUnsupported, node.describe() + ": " + what + " must be float32 (the only type implemented), got " +
                                          dtype_name(t->dtype()));
    if (x.rank() == 5)
      fail(ErrorKind::kUnsupported, node.describe() + ": volumetric (5-D) X " + shape_str(x.shape()) +
                                        " is not implemented, only 4-D [N, C, H, W]");
    if (x.rank() != 4)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": X must be [N, C, H, W], got " + shape_str(x.shape()));
    if (grid.rank() != 4 || grid.dim(0) != x.dim(0) || grid.dim(3) != 2)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": grid must be [N, H_out, W_out, 2] with N = " +
                                            std::to_string(x.dim(0)) + ", got " + shape_str(grid.shape()));
    const int64_t batches = x.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
    const int64_t points = grid.dim(1) * grid.dim(2);
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, {batches, channels, grid.dim(1), grid.dim(2)});
    if (y.numel() == 0) return;
    if (height == 0 || width == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": X " + shape_str(x.shape()) + " has no pixels to sample");

    const float* x_data = x.data<float>();
    const float* grid_data = grid.data<float>();
    float* y_data = y.data<float>();
    const int64_t blocks_per_batch = (points + kPointsPerBlock - 1) / kPointsPerBlock;
    const int64_t blocks = batches * blocks_per_batch;
    const GridSampleAttrs a = a_;
#pragma omp parallel if (blocks > 1 && batches * points * channels * kTaps >= kGridSampleParallelWork)
    {
      TapBlock plan;
#pragma omp for schedule(dynamic)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n = blk / blocks_per_batch, first = blk % blocks_per_batch * kPointsPerBlock;
        const int64_t count = std::min(kPointsPerBlock, points - first);
        plan_block<kTaps>(a, grid_data + (n * points + first) * 2, count, height, width, plan);
        for (int64_t c = 0; c < channels; ++c)
          apply_block<kTaps>(plan, count, x_data + (n * channels + c) * height * width,
                             y_data + (n * channels + c) * points + first);
      }
    }
  }

  GridSampleAttrs a_;
};

}  // namespace

std::unique_ptr<Kernel> make_grid_sample(const KernelInit& init) { return std::make_unique<GridSampleKernel>(init); }

}  // namespace slimquant::runtime::detection
