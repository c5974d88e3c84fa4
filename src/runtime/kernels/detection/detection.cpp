// NonMaxSuppression (opsets 10, 11) and RoiAlign (opsets 10, 16, 22): the box-level ops of
// detection heads (paddle2onnx PP-YOLOE / PicoDet with NMS exported, torchvision Mask R-CNN).
//
// Both follow ONNX's reference implementation (a port of ONNX Runtime's CPU kernels), including
// the details the spec text leaves open, so that exported models select the same boxes and pool
// the same values as in the runtime they were validated with:
//   NMS: a box is a candidate when its score is strictly greater than score_threshold (every box
//   when score_threshold is absent); candidates are visited by descending score, equal scores by
//   ascending box index; a candidate is dropped when its IoU with an already selected box of the
//   same class is strictly greater than iou_threshold; boxes with zero area never suppress or get
//   suppressed. Corners may come in either order (a diagonal pair). Output rows are grouped per
//   batch, then per class, in selection order.
//   RoiAlign: see the comment above RoiAlignKernel.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/detection/detection_kernels.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace detection {

namespace {

// Work (inner-loop iterations) below which a kernel stays on the calling thread.
constexpr int64_t kDetectionParallelWork = 1 << 15;

// The value of an optional one-element input (0-d or [1]); nullopt when the input is absent or
// empty, which ONNX's reference treats as "not given".
std::optional<int64_t> optional_int_scalar(const KernelContext& ctx, size_t i, const char* what) {
  const Tensor* t = ctx.optional_input(i);
  if (!t || t->numel() == 0) return std::nullopt;
  if (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)
    fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": " + what + " must be int64, got " + dtype_name(t->dtype()));
  if (t->numel() != 1)
    fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": " + what + " must hold one value, got shape " +
                                          shape_str(t->shape()));
  return t->to_int64_vector()[0];
}

std::optional<float> optional_float_scalar(const KernelContext& ctx, size_t i, const char* what) {
  const Tensor* t = ctx.optional_input(i);
  if (!t || t->numel() == 0) return std::nullopt;
  if (!dtype_is_float(t->dtype()))
    fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": " + what + " must be float, got " + dtype_name(t->dtype()));
  if (t->numel() != 1)
    fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": " + what + " must hold one value, got shape " +
                                          shape_str(t->shape()));
  return t->to_float_vector()[0];
}

void require_float32(const Tensor& t, const ir::Node& node, const char* what) {
  if (t.dtype() != DType::kFloat32)
    fail(ErrorKind::kUnsupported, node.describe() + ": " + what + " must be float32 (the only type implemented), got " +
                                      dtype_name(t.dtype()));
}

// ---- NonMaxSuppression -------------------------------------------------------------------------

enum class NmsInput : size_t { kBoxes, kScores, kMaxOutputBoxesPerClass, kIouThreshold, kScoreThreshold };
constexpr size_t slot(NmsInput i) { return static_cast<size_t>(i); }

// A box as sorted corners and its area, computed once per box (not once per pair) with the
// reference's float arithmetic, so IoUs at a threshold compare the same way.
struct BoxCorners {
  float x_min, y_min, x_max, y_max, area;
};

BoxCorners box_corners(const float* b, bool center_point_box) {
  BoxCorners c{};
  if (center_point_box) {  // [x_center, y_center, width, height]
    const float half_w = b[2] / 2, half_h = b[3] / 2;
    c.x_min = b[0] - half_w;
    c.x_max = b[0] + half_w;
    c.y_min = b[1] - half_h;
    c.y_max = b[1] + half_h;
  } else {  // [y1, x1, y2, x2], either diagonal pair
    c.x_min = std::min(b[1], b[3]);
    c.x_max = std::max(b[1], b[3]);
    c.y_min = std::min(b[0], b[2]);
    c.y_max = std::max(b[0], b[2]);
  }
  c.area = (c.x_max - c.x_min) * (c.y_max - c.y_min);
  return c;
}

// Whether `a` and `b` overlap by more than iou_threshold. Disjoint, touching or degenerate boxes
// never suppress.
bool suppresses(const BoxCorners& a, const BoxCorners& b, float iou_threshold) {
  const float ix_min = std::max(a.x_min, b.x_min), ix_max = std::min(a.x_max, b.x_max);
  if (ix_max <= ix_min) return false;
  const float iy_min = std::max(a.y_min, b.y_min), iy_max = std::min(a.y_max, b.y_max);
  if (iy_max <= iy_min) return false;
  const float intersection = (ix_max - ix_min) * (iy_max - iy_min);
  if (intersection <= 0) return false;
  const float union_area = a.area + b.area - intersection;
  if (a.area <= 0 || b.area <= 0 || union_area <= 0) return false;
  return intersection / union_area > iou_threshold;
}

struct Candidate {
  float score;
  int64_t box;
};

// The boxes kept so far for one class, ordered by x_min, so that a candidate is tested only
// against those that can overlap it along x: disjoint boxes never suppress. torchvision's batched
// NMS offsets each class's boxes apart and runs one NMS over all of them (tens of thousands of
// boxes): without this every candidate met every kept box. Boxes with a non-finite coordinate are
// kept aside and always tested, and boxes of no area never suppress, so the result is the same as
// testing them all.
class KeptBoxes {
 public:
  void clear() {
    by_x_.clear();
    unordered_.clear();
    max_width_ = 0.f;
  }

  bool suppress(const BoxCorners& box, float iou_threshold) const {
    for (const BoxCorners* k : unordered_)
      if (suppresses(box, *k, iou_threshold)) return true;
    // A kept box k overlaps box along x only if k.x_min < box.x_max and k.x_max > box.x_min, and
    // k.x_max <= k.x_min + max_width_: start a little before box.x_min - max_width_ (rounding).
    const float margin = max_width_ * 1.001f + std::fabs(box.x_min) * 1e-5f + 1e-30f;
    const float from = box.x_min - margin;
    auto it = std::lower_bound(by_x_.begin(), by_x_.end(), from,
                               [](const BoxCorners* k, float v) { return k->x_min < v; });
    for (; it != by_x_.end() && (*it)->x_min < box.x_max; ++it)
      if (suppresses(box, **it, iou_threshold)) return true;
    return false;
  }

  void add(const BoxCorners* box) {
    const bool finite = std::isfinite(box->x_min) && std::isfinite(box->x_max) && std::isfinite(box->y_min) &&
                        std::isfinite(box->y_max) && std::isfinite(box->area);
    if (!finite) {
      unordered_.push_back(box);
      return;
    }
    if (!(box->area > 0.f)) return;  // suppresses nothing
    auto at = std::upper_bound(by_x_.begin(), by_x_.end(), box->x_min,
                               [](float v, const BoxCorners* k) { return v < k->x_min; });
    by_x_.insert(at, box);
    max_width_ = std::max(max_width_, box->x_max - box->x_min);
  }

 private:
  std::vector<const BoxCorners*> by_x_;
  std::vector<const BoxCorners*> unordered_;
  float max_width_ = 0.f;
};

class NonMaxSuppressionKernel : public Kernel {
 public:
  explicit NonMaxSuppressionKernel(const KernelInit& init) {
    const int64_t cpb = init.node.attr_int("center_point_box", 0);
    if (cpb != 0 && cpb != 1)
      fail(ErrorKind::kInvalidModel, init.node.describe() + ": center_point_box must be 0 or 1, got " + std::to_string(cpb));
    center_point_box_ = cpb == 1;
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& boxes = ctx.input(slot(NmsInput::kBoxes));
    const Tensor& scores = ctx.input(slot(NmsInput::kScores));
    require_float32(boxes, node, "boxes");
    require_float32(scores, node, "scores");
    if (boxes.rank() != 3 || boxes.dim(2) != 4)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": boxes must be [num_batches, num_boxes, 4], got " +
                                            shape_str(boxes.shape()));
    if (scores.rank() != 3 || scores.dim(0) != boxes.dim(0) || scores.dim(2) != boxes.dim(1))
      fail(ErrorKind::kInvalidArgument, node.describe() + ": scores must be [num_batches, num_classes, num_boxes] = [" +
                                            std::to_string(boxes.dim(0)) + ", C, " + std::to_string(boxes.dim(1)) +
                                            "] for boxes " + shape_str(boxes.shape()) + ", got " +
                                            shape_str(scores.shape()));
    // Absent max_output_boxes_per_class means 0: nothing is selected (the spec's default).
    const int64_t max_per_class =
        std::max<int64_t>(optional_int_scalar(ctx, slot(NmsInput::kMaxOutputBoxesPerClass), "max_output_boxes_per_class")
                              .value_or(0),
                          0);
    const float iou_threshold = optional_float_scalar(ctx, slot(NmsInput::kIouThreshold), "iou_threshold").value_or(0.f);
    if (!(iou_threshold >= 0.f && iou_threshold <= 1.f))
      fail(ErrorKind::kInvalidArgument, node.describe() + ": iou_threshold must be in [0, 1], got " +
                                            std::to_string(iou_threshold));
    const std::optional<float> score_threshold =
        optional_float_scalar(ctx, slot(NmsInput::kScoreThreshold), "score_threshold");

    const int64_t num_batches = boxes.dim(0), num_boxes = boxes.dim(1), num_classes = scores.dim(1);
    const int64_t pairs = max_per_class > 0 && num_boxes > 0 ? num_batches * num_classes : 0;

    std::vector<BoxCorners> corners(static_cast<size_t>(num_batches * num_boxes));
    const float* box_data = boxes.data<float>();
    for (size_t i = 0; i < corners.size(); ++i) corners[i] = box_corners(box_data + 4 * i, center_point_box_);

    // Selected box indices of each (batch, class) pair; pairs are independent, so large inputs
    // (thousands of anchors times tens of classes) run them in parallel.
    std::vector<std::vector<int64_t>> selected(static_cast<size_t>(pairs));
    const float* score_data = scores.data<float>();
#pragma omp parallel if (pairs > 1 && pairs * num_boxes >= kDetectionParallelWork)
    {
      std::vector<Candidate> candidates;
      KeptBoxes kept;
#pragma omp for schedule(dynamic)
      for (int64_t p = 0; p < pairs; ++p) {
        const int64_t batch = p / num_classes;
        const float* class_scores = score_data + p * num_boxes;
        const BoxCorners* batch_corners = corners.data() + batch * num_boxes;
        candidates.clear();
        // NaN scores never rank (and would break the sort's ordering).
        for (int64_t b = 0; b < num_boxes; ++b) {
          const float s = class_scores[b];
          if (score_threshold ? s > *score_threshold : !std::isnan(s)) candidates.push_back({s, b});
        }
        std::sort(candidates.begin(), candidates.end(), [](const Candidate& l, const Candidate& r) {
          return l.score > r.score || (l.score == r.score && l.box < r.box);
        });
        std::vector<int64_t>& out = selected[static_cast<size_t>(p)];
        kept.clear();
        for (const Candidate& c : candidates) {
          if (static_cast<int64_t>(out.size()) >= max_per_class) break;
          const BoxCorners& box = batch_corners[c.box];
          if (kept.suppress(box, iou_threshold)) continue;
          kept.add(&box);
          out.push_back(c.box);
        }
      }
    }

    int64_t total = 0;
    for (const auto& s : selected) total += static_cast<int64_t>(s.size());
    Tensor& y = ctx.allocate_output(0, DType::kInt64, {total, 3});
    int64_t* row = y.data<int64_t>();
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t box : selected[static_cast<size_t>(p)]) {
        row[0] = p / num_classes;
        row[1] = p % num_classes;
        row[2] = box;
        row += 3;
      }
  }

 private:
  bool center_point_box_ = false;
};

// ---- RoiAlign ----------------------------------------------------------------------------------

enum class RoiAlignInput : size_t { kX, kRois, kBatchIndices };
constexpr size_t slot(RoiAlignInput i) { return static_cast<size_t>(i); }

struct RoiAlignAttrs {
  bool max_mode = false;
  int64_t out_h = 1, out_w = 1;
  int64_t sampling_ratio = 0;  // 0: adaptive, ceil(roi size / output size) per axis
  float spatial_scale = 1.f;
  bool half_pixel = true;  // opset 16 default; opset 10 behaves as output_half_pixel
};

// One roi in feature-map coordinates: its origin, bin size and sampling grid.
struct RoiGeometry {
  int64_t batch;
  float start_h, start_w, bin_h, bin_w;
  int64_t grid_h, grid_w;  // sampling points per bin along each axis (0 when the roi is empty)
};

// One bilinear sampling point: the four taps (plane offsets) and their weights. Points outside
// the feature map have zero weights.
struct SamplePoint {
  int64_t pos[4];
  float w[4];
};

// Sampling points beyond which a roi is refused (adaptive sampling of an absurdly large roi).
constexpr int64_t kMaxSamplesPerRoi = int64_t{1} << 24;

// RoiAlign as ONNX's reference computes it: roi corners are scaled by spatial_scale (and shifted
// by -0.5 in half_pixel mode; output_half_pixel instead forces rois to at least 1x1); each output
// bin averages (or maxes) grid_h x grid_w bilinear samples at the centres of a regular sub-grid.
// A sample more than one pixel outside the map contributes 0; one within a pixel of the edge is
// clamped onto it. In max mode the reference takes, per sample, the largest of the four *weighted*
// taps (max(w1*v1, ..., w4*v4)), not the interpolated value: ONNX Runtime keeps this by default
// (onnxruntime#6146) and so do we, so that results match the runtime models are validated with.
class RoiAlignKernel : public Kernel {
 public:
  explicit RoiAlignKernel(const KernelInit& init) {
    const ir::Node& node = init.node;
    const std::string mode = node.attr_string("mode", "avg");
    if (mode != "avg" && mode != "max")
      fail(ErrorKind::kInvalidModel, node.describe() + ": mode must be 'avg' or 'max', got '" + mode + "'");
    a_.max_mode = mode == "max";
    a_.out_h = node.attr_int("output_height", 1);
    a_.out_w = node.attr_int("output_width", 1);
    a_.sampling_ratio = node.attr_int("sampling_ratio", 0);
    a_.spatial_scale = node.attr_float("spatial_scale", 1.f);
    if (a_.out_h < 1 || a_.out_w < 1)
      fail(ErrorKind::kInvalidModel, node.describe() + ": output_height and output_width must be >= 1, got " +
                                         std::to_string(a_.out_h) + " x " + std::to_string(a_.out_w));
    if (a_.sampling_ratio < 0)
      fail(ErrorKind::kInvalidModel, node.describe() + ": sampling_ratio must be >= 0, got " +
                                         std::to_string(a_.sampling_ratio));
    // RoiAlign-10 had no coordinate_transformation_mode; it behaved as output_half_pixel.
    const std::string ctm =
        node.attr_string("coordinate_transformation_mode", init.opset >= 16 ? "half_pixel" : "output_half_pixel");
    if (ctm != "half_pixel" && ctm != "output_half_pixel")
      fail(ErrorKind::kInvalidModel, node.describe() +
                                         ": coordinate_transformation_mode must be 'half_pixel' or "
                                         "'output_half_pixel', got '" + ctm + "'");
    a_.half_pixel = ctm == "half_pixel";
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(slot(RoiAlignInput::kX));
    const Tensor& rois = ctx.input(slot(RoiAlignInput::kRois));
    const Tensor& batch_indices = ctx.input(slot(RoiAlignInput::kBatchIndices));
    require_float32(x, node, "X");
    require_float32(rois, node, "rois");
    if (x.rank() != 4)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": X must be [N, C, H, W], got " + shape_str(x.shape()));
    if (rois.rank() != 2 || rois.dim(1) != 4)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": rois must be [num_rois, 4], got " + shape_str(rois.shape()));
    if (batch_indices.dtype() != DType::kInt64 && batch_indices.dtype() != DType::kInt32)
      fail(ErrorKind::kInvalidModel, node.describe() + ": batch_indices must be int64, got " +
                                         dtype_name(batch_indices.dtype()));
    if (batch_indices.rank() != 1 || batch_indices.dim(0) != rois.dim(0))
      fail(ErrorKind::kInvalidArgument, node.describe() + ": batch_indices " + shape_str(batch_indices.shape()) +
                                            " must be [num_rois] for rois " + shape_str(rois.shape()));

    const int64_t num_rois = rois.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
    if ((height == 0 || width == 0) && num_rois > 0 && channels > 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": X " + shape_str(x.shape()) + " has no pixels to pool");
    const std::vector<int64_t> batch = batch_indices.to_int64_vector();
    // Geometry first, on this thread: bad rois throw here, never inside the parallel region.
    std::vector<RoiGeometry> geometry(static_cast<size_t>(num_rois));
    const float* roi_data = rois.data<float>();
    for (int64_t r = 0; r < num_rois; ++r)
      geometry[static_cast<size_t>(r)] = roi_geometry(roi_data + 4 * r, batch[static_cast<size_t>(r)], x.dim(0), r, node);

    Tensor& y = ctx.allocate_output(0, DType::kFloat32, {num_rois, channels, a_.out_h, a_.out_w});
    if (y.numel() == 0) return;
    const float* x_data = x.data<float>();
    float* y_data = y.data<float>();
    const int64_t bins = a_.out_h * a_.out_w;
    int64_t samples = 0;
    for (const RoiGeometry& g : geometry) samples += g.grid_h * g.grid_w;
#pragma omp parallel if (num_rois > 1 && samples * bins * channels >= kDetectionParallelWork)
    {
      std::vector<SamplePoint> plan;
#pragma omp for schedule(dynamic)
      for (int64_t r = 0; r < num_rois; ++r) {
        const RoiGeometry& g = geometry[static_cast<size_t>(r)];
        plan_samples(g, height, width, plan);
        const int64_t per_bin = g.grid_h * g.grid_w;
        const float count = static_cast<float>(std::max<int64_t>(per_bin, 1));
        for (int64_t c = 0; c < channels; ++c) {
          const float* plane = x_data + (g.batch * channels + c) * height * width;
          float* out = y_data + (r * channels + c) * bins;
          const SamplePoint* s = plan.data();
          for (int64_t bin = 0; bin < bins; ++bin, s += per_bin) {
            float v = 0.f;
            if (a_.max_mode) {
              for (int64_t k = 0; k < per_bin; ++k) {
                const SamplePoint& p = s[k];
                const float m = std::max(std::max(p.w[0] * plane[p.pos[0]], p.w[1] * plane[p.pos[1]]),
                                         std::max(p.w[2] * plane[p.pos[2]], p.w[3] * plane[p.pos[3]]));
                v = k == 0 ? m : std::max(v, m);
              }
            } else {
              for (int64_t k = 0; k < per_bin; ++k) {
                const SamplePoint& p = s[k];
                v += p.w[0] * plane[p.pos[0]] + p.w[1] * plane[p.pos[1]] + p.w[2] * plane[p.pos[2]] +
                     p.w[3] * plane[p.pos[3]];
              }
              v /= count;
            }
            out[bin] = v;
          }
        }
      }
    }
  }

 private:
  RoiGeometry roi_geometry(const float* roi, int64_t batch, int64_t num_batches, int64_t r, const ir::Node& node) const {
    const std::string which = node.describe() + ": roi " + std::to_string(r);
    if (batch < 0 || batch >= num_batches)
      fail(ErrorKind::kInvalidArgument, which + " has batch index " + std::to_string(batch) + ", X has " +
                                            std::to_string(num_batches) + " images");
    if (!std::all_of(roi, roi + 4, [](float v) { return std::isfinite(v); }))
      fail(ErrorKind::kInvalidArgument, which + " has a non-finite coordinate");
    // No rounding of the corners: this is what makes it RoiAlign rather than RoiPool.
    const float offset = a_.half_pixel ? 0.5f : 0.f;
    RoiGeometry g{};
    g.batch = batch;
    g.start_w = roi[0] * a_.spatial_scale - offset;
    g.start_h = roi[1] * a_.spatial_scale - offset;
    float roi_w = (roi[2] * a_.spatial_scale - offset) - g.start_w;
    float roi_h = (roi[3] * a_.spatial_scale - offset) - g.start_h;
    if (!a_.half_pixel) {  // malformed rois become 1x1
      roi_w = std::max(roi_w, 1.f);
      roi_h = std::max(roi_h, 1.f);
    }
    g.bin_h = roi_h / static_cast<float>(a_.out_h);
    g.bin_w = roi_w / static_cast<float>(a_.out_w);
    auto grid = [&](float bin) {
      if (a_.sampling_ratio > 0) return a_.sampling_ratio;
      const float n = std::ceil(bin);  // an inverted roi (half_pixel) samples nothing
      if (!(n < static_cast<float>(kMaxSamplesPerRoi)))
        fail(ErrorKind::kInvalidArgument, which + " is too large for adaptive sampling (" + std::to_string(roi_w) +
                                              " x " + std::to_string(roi_h) + " pixels)");
      return std::max<int64_t>(static_cast<int64_t>(n), 0);
    };
    g.grid_h = grid(g.bin_h);
    g.grid_w = grid(g.bin_w);
    if (g.grid_h * g.grid_w > kMaxSamplesPerRoi / (a_.out_h * a_.out_w))
      fail(ErrorKind::kInvalidArgument, which + " needs " + std::to_string(g.grid_h) + " x " + std::to_string(g.grid_w) +
                                            " samples per bin, more than this kernel allows");
    return g;
  }

  // The sampling points of every bin of a roi, bin-major, shared by all channels.
  void plan_samples(const RoiGeometry& g, int64_t height, int64_t width, std::vector<SamplePoint>& plan) const {
    plan.resize(static_cast<size_t>(a_.out_h * a_.out_w * g.grid_h * g.grid_w));
    const float fh = static_cast<float>(height), fw = static_cast<float>(width);
    size_t i = 0;
    for (int64_t ph = 0; ph < a_.out_h; ++ph)
      for (int64_t pw = 0; pw < a_.out_w; ++pw)
        for (int64_t iy = 0; iy < g.grid_h; ++iy) {
          const float yy = g.start_h + static_cast<float>(ph) * g.bin_h +
                           (static_cast<float>(iy) + .5f) * g.bin_h / static_cast<float>(g.grid_h);
          for (int64_t ix = 0; ix < g.grid_w; ++ix, ++i) {
            float x = g.start_w + static_cast<float>(pw) * g.bin_w +
                      (static_cast<float>(ix) + .5f) * g.bin_w / static_cast<float>(g.grid_w);
            float y = yy;
            SamplePoint& p = plan[i];
            if (y < -1.f || y > fh || x < -1.f || x > fw) {
              p = SamplePoint{};
              continue;
            }
            y = std::max(y, 0.f);
            x = std::max(x, 0.f);
            int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
            if (y_low >= height - 1) {
              y_high = y_low = height - 1;
              y = static_cast<float>(y_low);
            } else {
              y_high = y_low + 1;
            }
            if (x_low >= width - 1) {
              x_high = x_low = width - 1;
              x = static_cast<float>(x_low);
            } else {
              x_high = x_low + 1;
            }
            const float ly = y - static_cast<float>(y_low), lx = x - static_cast<float>(x_low);
            const float hy = 1.f - ly, hx = 1.f - lx;
            p.pos[0] = y_low * width + x_low;
            p.pos[1] = y_low * width + x_high;
            p.pos[2] = y_high * width + x_low;
            p.pos[3] = y_high * width + x_high;
            p.w[0] = hy * hx;
            p.w[1] = hy * lx;
            p.w[2] = ly * hx;
            p.w[3] = ly * lx;
          }
        }
  }

  RoiAlignAttrs a_;
};

}  // namespace

std::unique_ptr<Kernel> make_non_max_suppression(const KernelInit& init) {
  return std::make_unique<NonMaxSuppressionKernel>(init);
}
std::unique_ptr<Kernel> make_roi_align(const KernelInit& init) { return std::make_unique<RoiAlignKernel>(init); }

}  // namespace detection

void register_detection_kernels(KernelRegistry& r) {
  using namespace detection;
  r.add("NonMaxSuppression", make_non_max_suppression);
  r.add("RoiAlign", make_roi_align);
  r.add("GridSample", make_grid_sample);
}

}  // namespace slimquant::runtime
