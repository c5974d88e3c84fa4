// Detection ops: the NonMaxSuppression semantics the ONNX node data leaves thin (strict IoU and
// score thresholds checked with IoUs worked out by hand, diagonal corners given in either order),
// RoiAlign-10's implicit coordinate mode, and error messages that name the node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "kernel_test_util.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

// Named like an exported detection head's node, so messages can be checked for it.
ir::Node make_node(const std::string& op, size_t n_inputs) {
  ir::Node n = kernel_test::make_node(op, n_inputs);
  n.name = "/head/" + op + "_0";
  return n;
}
using kernel_test::run1;

std::vector<int64_t> nms(const std::vector<float>& boxes, const std::vector<float>& scores, int64_t max_per_class,
                         float iou_threshold, float score_threshold) {
  const int64_t n = static_cast<int64_t>(scores.size());
  Tensor y = run1(make_node("NonMaxSuppression", 5), 11,
                    {Tensor::from_vector<float>({1, n, 4}, boxes), Tensor::from_vector<float>({1, 1, n}, scores),
                     Tensor::from_vector<int64_t>({1}, {max_per_class}), Tensor::from_vector<float>({1}, {iou_threshold}),
                     Tensor::from_vector<float>({1}, {score_threshold})});
  EXPECT_EQ(y.rank(), 2u);
  EXPECT_EQ(y.dim(1), 3);
  return y.to_int64_vector();
}

// Boxes are [y1, x1, y2, x2], all 1 high:
//   box 0: x in [0, 1],    area 1, score 0.9
//   box 1: x in [0.5, 1.5], area 1, score 0.7: overlaps box 0 on 0.5 -> IoU 0.5 / 1.5 = 1/3
//   box 2: x in [0.25, 1.25], area 1, score 0.8: overlaps box 0 on 0.75 -> IoU 0.75 / 1.25 = 0.6
// With iou_threshold 0.5 box 2 (0.6 > 0.5) is suppressed by box 0 and box 1 (1/3) is kept.
const std::vector<float> kOverlapBoxes = {0, 0, 1, 1, 0, 0.5f, 1, 1.5f, 0, 0.25f, 1, 1.25f};
const std::vector<float> kOverlapScores = {0.9f, 0.7f, 0.8f};

TEST(DetectionOps, NmsSuppressesOnlyAboveTheIouThreshold) {
  EXPECT_EQ(nms(kOverlapBoxes, kOverlapScores, 10, 0.5f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  // Between the two IoUs nothing changes; above 0.6 box 2 survives and ranks before box 1.
  EXPECT_EQ(nms(kOverlapBoxes, kOverlapScores, 10, 0.34f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(nms(kOverlapBoxes, kOverlapScores, 10, 0.61f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 2, 0, 0, 1}));
  // Below 1/3 box 1 goes too.
  EXPECT_EQ(nms(kOverlapBoxes, kOverlapScores, 10, 0.3f, 0.f), (std::vector<int64_t>{0, 0, 0}));
  // max_output_boxes_per_class caps the selection, in score order.
  EXPECT_EQ(nms(kOverlapBoxes, kOverlapScores, 1, 0.61f, 0.f), (std::vector<int64_t>{0, 0, 0}));
}

// Greedy NMS that tests every kept box, with the kernel's IoU arithmetic: the reference for the
// kernel's pruned search.
std::vector<int64_t> brute_force_nms(const std::vector<float>& boxes, const std::vector<float>& scores,
                                     float iou_threshold) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t l, size_t r) { return scores[l] > scores[r]; });
  auto corner = [&](size_t i, int k) { return boxes[4 * i + static_cast<size_t>(k)]; };
  auto iou_above = [&](size_t a, size_t b) {
    const float ax0 = std::min(corner(a, 1), corner(a, 3)), ax1 = std::max(corner(a, 1), corner(a, 3));
    const float ay0 = std::min(corner(a, 0), corner(a, 2)), ay1 = std::max(corner(a, 0), corner(a, 2));
    const float bx0 = std::min(corner(b, 1), corner(b, 3)), bx1 = std::max(corner(b, 1), corner(b, 3));
    const float by0 = std::min(corner(b, 0), corner(b, 2)), by1 = std::max(corner(b, 0), corner(b, 2));
    const float area_a = (ax1 - ax0) * (ay1 - ay0), area_b = (bx1 - bx0) * (by1 - by0);
    const float ix0 = std::max(ax0, bx0), ix1 = std::min(ax1, bx1), iy0 = std::max(ay0, by0), iy1 = std::min(ay1, by1);
    if (ix1 <= ix0 || iy1 <= iy0) return false;
    const float inter = (ix1 - ix0) * (iy1 - iy0), uni = area_a + area_b - inter;
    if (inter <= 0 || area_a <= 0 || area_b <= 0 || uni <= 0) return false;
    return inter / uni > iou_threshold;
  };
  std::vector<size_t> kept;
  std::vector<int64_t> out;
  for (size_t c : order) {
    if (std::any_of(kept.begin(), kept.end(), [&](size_t k) { return iou_above(c, k); })) continue;
    kept.push_back(c);
    for (int64_t v : {int64_t{0}, int64_t{0}, static_cast<int64_t>(c)}) out.push_back(v);
  }
  return out;
}

// torchvision's batched NMS: 40 classes of boxes shifted apart by class, one NMS over all 4000,
// with clusters that suppress each other, boxes of very different widths, a zero-area box and one
// with an infinite corner. The kernel only tests kept boxes that overlap along x; the selection
// must equal testing every kept box.
TEST(DetectionOps, NmsOverOffsetClassesEqualsTestingEveryKeptBox) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> pos(0.f, 300.f), size(2.f, 60.f), jitter(-3.f, 3.f), score(0.f, 1.f);
  std::vector<float> boxes, scores;
  for (int cls = 0; cls < 40; ++cls) {
    const float offset = 1000.f * static_cast<float>(cls);
    for (int i = 0; i < 100; ++i) {
      const float y = pos(gen), x = pos(gen) + offset, h = size(gen), w = i % 10 == 0 ? 250.f : size(gen);
      boxes.insert(boxes.end(), {y, x, y + h, x + w});
      scores.push_back(score(gen));
      // A near copy that the first suppresses or not, depending on the jitter.
      boxes.insert(boxes.end(), {y + jitter(gen), x + jitter(gen), y + h + jitter(gen), x + w + jitter(gen)});
      scores.push_back(score(gen));
    }
  }
  boxes.insert(boxes.end(), {5, 5, 5, 40});  // zero area
  scores.push_back(0.99f);
  boxes.insert(boxes.end(), {0, 0, 10, std::numeric_limits<float>::infinity()});
  scores.push_back(0.98f);
  for (float t : {0.f, 0.3f, 0.5f, 0.9f})
    EXPECT_EQ(nms(boxes, scores, 100000, t, -1.f), brute_force_nms(boxes, scores, t)) << "iou_threshold " << t;
}

TEST(DetectionOps, NmsThresholdsAreStrict) {
  // Box 1 lies inside box 0: x in [0, 2] vs [0, 1], both 2 high -> IoU 2 / 4 = 0.5 exactly, which
  // does not exceed iou_threshold 0.5: both are kept.
  const std::vector<float> nested = {0, 0, 2, 2, 0, 0, 2, 1};
  EXPECT_EQ(nms(nested, {0.9f, 0.8f}, 10, 0.5f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(nms(nested, {0.9f, 0.8f}, 10, 0.49f, 0.f), (std::vector<int64_t>{0, 0, 0}));
  // A score equal to score_threshold is not a candidate.
  EXPECT_EQ(nms(nested, {0.9f, 0.8f}, 10, 0.5f, 0.8f), (std::vector<int64_t>{0, 0, 0}));
}

TEST(DetectionOps, NmsAcceptsCornersInEitherOrder) {
  // The same three boxes, each given by another diagonal: (y2, x2, y1, x1), (y1, x2, y2, x1),
  // (y2, x1, y1, x2). The spec allows any diagonal pair, so the selection must not change.
  const std::vector<float> swapped = {1, 1, 0, 0, 0, 1.5f, 1, 0.5f, 1, 0.25f, 0, 1.25f};
  EXPECT_EQ(nms(swapped, kOverlapScores, 10, 0.5f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(nms(swapped, kOverlapScores, 10, 0.61f, 0.f), (std::vector<int64_t>{0, 0, 0, 0, 0, 2, 0, 0, 1}));
  // The same boxes as [x_center, y_center, width, height] with center_point_box = 1.
  ir::Node node = make_node("NonMaxSuppression", 5);
  node.attrs["center_point_box"] = int64_t{1};
  Tensor y = run1(node, 11,
                    {Tensor::from_vector<float>({1, 3, 4}, {0.5f, 0.5f, 1, 1, 1, 0.5f, 1, 1, 0.75f, 0.5f, 1, 1}),
                     Tensor::from_vector<float>({1, 1, 3}, kOverlapScores), Tensor::from_vector<int64_t>({1}, {10}),
                     Tensor::from_vector<float>({1}, {0.5f}), Tensor::from_vector<float>({1}, {0.f})});
  EXPECT_EQ(y.to_int64_vector(), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
}

TEST(DetectionOps, NmsWithoutMaxOutputSelectsNothing) {
  // max_output_boxes_per_class defaults to 0: an empty [0, 3] result, not an error.
  Tensor y = run1(make_node("NonMaxSuppression", 2), 10,
                    {Tensor::from_vector<float>({1, 3, 4}, kOverlapBoxes), Tensor::from_vector<float>({1, 1, 3}, kOverlapScores)});
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
}

TEST(DetectionOps, NmsWrongBoxesRankNamesTheNode) {
  const ir::Node node = make_node("NonMaxSuppression", 5);
  try {
    run1(node, 11,
           {Tensor::from_vector<float>({3, 4}, kOverlapBoxes), Tensor::from_vector<float>({1, 1, 3}, kOverlapScores),
            Tensor::from_vector<int64_t>({1}, {10}), Tensor::from_vector<float>({1}, {0.5f}),
            Tensor::from_vector<float>({1}, {0.f})});
    ADD_FAILURE() << "rank-2 boxes were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("NonMaxSuppression '/head/NonMaxSuppression_0': boxes must be "
                                         "[num_batches, num_boxes, 4], got [3x4]"),
              std::string::npos)
        << e.what();
  }
}

TEST(DetectionOps, RoiAlignOpset10IsOutputHalfPixel) {
  // RoiAlign-10 has no coordinate_transformation_mode; it must pool like opset 16's
  // output_half_pixel, not like opset 16's default half_pixel.
  Tensor x(DType::kFloat32, {1, 1, 6, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 7) * 0.5f + static_cast<float>(i / 6);
  const Tensor rois = Tensor::from_vector<float>({2, 4}, {0.5f, 1, 4, 5.5f, 2, 0, 3, 2});
  const Tensor batch = Tensor::from_vector<int64_t>({2}, {0, 0});
  auto pool = [&](int64_t opset, const char* mode) {
    ir::Node node = make_node("RoiAlign", 3);
    node.attrs["output_height"] = int64_t{3};
    node.attrs["output_width"] = int64_t{2};
    if (mode) node.attrs["coordinate_transformation_mode"] = std::string(mode);
    return run1(node, opset, {x, rois, batch}).to_float_vector();
  };
  EXPECT_EQ(pool(10, nullptr), pool(16, "output_half_pixel"));
  EXPECT_NE(pool(10, nullptr), pool(16, nullptr));
  EXPECT_EQ(pool(16, nullptr), pool(16, "half_pixel"));
}

}  // namespace
}  // namespace slimquant::runtime
