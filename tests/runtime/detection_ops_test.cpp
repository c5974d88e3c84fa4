// Detection ops: the NonMaxSuppression semantics the ONNX node data leaves thin (strict IoU and
// score thresholds checked with IoUs worked out by hand, diagonal corners given in either order),
// RoiAlign-10's implicit coordinate mode, and error messages that name the node.
#include <gtest/gtest.h>

#include <cstring>
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
