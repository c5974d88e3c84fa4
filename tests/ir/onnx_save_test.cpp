// Saving what was loaded: forms of graph inputs and outputs that are valid ONNX but that
// onnx::checker (which every save runs) would refuse on its own.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <fstream>

#include "graph_builder.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

// A tensor output without a shape (unknown rank), as some exporters write graph outputs: saved as it
// came (not refused after a long quantization, and no rank invented), loaded and run again.
TEST(OnnxSave, AnOutputOfUnknownRankIsWrittenAsItCame) {
  test::TempDir tmp("onnx_save_unknown_rank");
  test::GraphBuilder b;
  b.g.opset = 17;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {3, ""}}});
  const std::string y = b.node("Relu", {"x"});
  b.g.outputs.push_back({y, DType::kFloat32, std::nullopt});
  ir::save_onnx(b.g, tmp.path("m.onnx"));

  onnx::ModelProto m;
  std::ifstream in(tmp.path("m.onnx"), std::ios::binary);
  ASSERT_TRUE(m.ParseFromIstream(&in));
  ASSERT_EQ(m.graph().output_size(), 1);
  EXPECT_TRUE(m.graph().output(0).type().has_tensor_type());
  EXPECT_FALSE(m.graph().output(0).type().tensor_type().has_shape());
  EXPECT_TRUE(m.graph().input(0).type().tensor_type().has_shape());

  runtime::Session session(ir::load_onnx(tmp.path("m.onnx")));
  const Tensor x = Tensor::from_vector<float>({2, 3}, {-1.f, 2.f, -3.f, 4.f, 0.f, 5.f});
  const Tensor out = session.run({{"x", x}}).at(y);
  const std::vector<float> want = {0.f, 2.f, 0.f, 4.f, 0.f, 5.f};
  ASSERT_EQ(out.numel(), 6);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out.data<float>()[i], want[static_cast<size_t>(i)]) << i;
}
