// ONNX's INT4 / UINT4 initializers (held unpacked, saved packed two a byte, low nibble first) and
// ai.onnx opset 21, newer than the ONNX library (1.12, opset 17) the loader links.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <fstream>
#include <sstream>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

ir::Graph blocked_dequantize_graph(int64_t opset) {
  ir::Graph g;
  g.opset = opset;
  g.ir_version = 10;
  Tensor codes(DType::kInt8, {3, 5});  // 15 values: an odd count leaves the last high nibble 0
  for (int64_t i = 0; i < 15; ++i) codes.data<int8_t>()[i] = static_cast<int8_t>(i - 8);
  g.initializers["codes"] = codes;
  g.stored_4bit_types["codes"] = 22;
  Tensor scales(DType::kFloat32, {2, 5});
  for (auto& s : scales.values<float>()) s = 0.5f;
  g.initializers["scales"] = scales;
  ir::Node dq;
  dq.op_type = "DequantizeLinear";
  dq.name = "dq";
  dq.inputs = {"codes", "scales"};
  dq.outputs = {"w"};
  dq.attrs["axis"] = int64_t{0};
  dq.attrs["block_size"] = int64_t{2};
  ir::Node mm;
  mm.op_type = "MatMul";
  mm.name = "mm";
  mm.inputs = {"x", "w"};
  mm.outputs = {"y"};
  g.nodes = {dq, mm};
  g.inputs = {ir::ValueInfo{"x", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{1, ""}, ir::Dim{3, ""}}}};
  g.outputs = {ir::ValueInfo{"y", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{1, ""}, ir::Dim{5, ""}}}};
  return g;
}

onnx::ModelProto read_proto(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(s.str()));
  return m;
}

TEST(Int4Tensors, SavedPackedLowNibbleFirstAndLoadedUnpacked) {
  test::TempDir tmp("int4_opset21");
  const ir::Graph g = blocked_dequantize_graph(21);
  ir::save_onnx(g, tmp.path("m.onnx"));
  const onnx::ModelProto m = read_proto(tmp.path("m.onnx"));
  EXPECT_EQ(m.ir_version(), 10);
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).version(), 21);
  const onnx::TensorProto* codes = nullptr;
  for (const auto& t : m.graph().initializer())
    if (t.name() == "codes") codes = &t;
  ASSERT_NE(codes, nullptr);
  EXPECT_EQ(codes->data_type(), 22);
  ASSERT_EQ(codes->raw_data().size(), 8u);
  // -8, -7 -> nibbles 0x8, 0x9 -> byte 0x98; the 15th value (6 -> 0x6) alone in the last byte.
  EXPECT_EQ(static_cast<uint8_t>(codes->raw_data()[0]), 0x98);
  EXPECT_EQ(static_cast<uint8_t>(codes->raw_data()[7]), 0x06);

  const ir::Graph back = ir::load_onnx(tmp.path("m.onnx"));
  EXPECT_EQ(back.opset, 21);
  EXPECT_EQ(back.stored_4bit_types.at("codes"), 22);
  const Tensor& c = back.initializers.at("codes");
  ASSERT_EQ(c.dtype(), DType::kInt8);
  ASSERT_EQ(c.shape(), (Shape{3, 5}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(c.data<int8_t>()[i], i - 8);
  EXPECT_EQ(back.nodes[0].attr_int("block_size", 0), 2);
  // Shape inference (libonnx 1.12 sees the node at its newest opset, 17) still types the output.
  ir::Graph typed = back;
  EXPECT_NO_THROW(ir::infer_shapes_onnx(typed));
}

TEST(Int4Tensors, OutOfRangeCodesAreRefusedOnSave) {
  test::TempDir tmp("int4_range");
  ir::Graph g = blocked_dequantize_graph(21);
  g.initializers["codes"].data<int8_t>()[4] = 9;
  try {
    ir::save_onnx(g, tmp.path("m.onnx"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("INT4"), std::string::npos) << e.what();
  }
}

TEST(Opset21, NodesUsingWhatChangedAfterTheLibrarysOpsetAreRefusedNamingThem) {
  test::TempDir tmp("opset21_changed");
  ir::Graph g = blocked_dequantize_graph(21);
  ir::Node reduce;
  reduce.op_type = "ReduceMean";
  reduce.name = "mean";
  reduce.inputs = {"y"};
  reduce.outputs = {"m"};
  g.nodes.push_back(reduce);
  g.outputs = {ir::ValueInfo{"m", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{1, ""}, ir::Dim{1, ""}}}};
  // A ReduceMean without axes reduces everything in every opset: it uses nothing that changed.
  ir::save_onnx(g, tmp.path("all.onnx"));
  EXPECT_EQ(ir::load_onnx(tmp.path("all.onnx")).opset, 21);
  // The axes input of opset 18 (written into the file directly: save_onnx checks the model at the
  // library's opset, where ReduceMean takes one input). A constant one loads and reduces that axis
  // (the library checks it as the attribute it was); one computed at run time is refused.
  onnx::ModelProto m = read_proto(tmp.path("all.onnx"));
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == "mean") n.add_input("axes");
  onnx::TensorProto* axes = m.mutable_graph()->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(onnx::TensorProto::INT64);
  axes->add_dims(1);
  axes->add_int64_data(1);
  m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  std::ofstream(tmp.path("constant_axes.onnx"), std::ios::binary) << m.SerializeAsString();
  const ir::Graph constant_axes = ir::load_onnx(tmp.path("constant_axes.onnx"));
  Tensor x(DType::kFloat32, {1, 3});
  for (float& v : x.values<float>()) v = 1.f;
  const Tensor mean = runtime::Session(constant_axes).run({{"x", x}}).at("m");
  EXPECT_EQ(mean.shape(), (Shape{1, 1}));
  // w = 0.5 * (code - 0): row sums of the codes over 3 rows, averaged over the 5 columns.
  float expected = 0.f;
  for (int64_t i = 0; i < 15; ++i) expected += 0.5f * static_cast<float>(i - 8);
  EXPECT_FLOAT_EQ(mean.to_float_vector()[0], expected / 5.f);
  m.mutable_graph()->mutable_initializer()->RemoveLast();
  onnx::ValueInfoProto* runtime_axes = m.mutable_graph()->add_input();
  runtime_axes->set_name("axes");
  runtime_axes->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  std::ofstream(tmp.path("m.onnx"), std::ios::binary) << m.SerializeAsString();
  try {
    ir::load_onnx(tmp.path("m.onnx"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("ReduceMean"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("opset 18"), std::string::npos) << e.what();
  }
  // A graph without them is raised to 21 (the older forms are rewritten: RaisingRewritesTheFormsThatChanged).
  ir::Graph at17 = blocked_dequantize_graph(17);
  at17.nodes.erase(at17.nodes.begin());
  at17.nodes[0].inputs[1] = "wf";
  at17.initializers.clear();
  at17.stored_4bit_types.clear();
  at17.initializers["wf"] = Tensor(DType::kFloat32, {3, 5});
  ir::convert_opset(at17, 21);
  EXPECT_EQ(at17.opset, 21);
  EXPECT_GE(at17.ir_version, 10);
  EXPECT_THROW(ir::convert_opset(at17, 22), Error);
}

// Raising to opset 18 or later rewrites what changed there: a reduction's axes attribute becomes
// its input, and a Split without sizes states num_outputs; the raised file loads and computes the same.
TEST(Opset21, RaisingRewritesTheFormsThatChangedAndTheFileComputesTheSame) {
  test::TempDir tmp("opset21_raised");
  ir::Graph g;
  g.opset = 17;
  g.inputs = {ir::ValueInfo{"x", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{2, ""}, ir::Dim{6, ""}}}};
  ir::Node split;
  split.op_type = "Split";
  split.name = "split";
  split.inputs = {"x"};
  split.outputs = {"a", "b", "c"};
  split.attrs["axis"] = int64_t{1};
  ir::Node reduce;
  reduce.op_type = "ReduceMean";
  reduce.name = "mean";
  reduce.inputs = {"b"};
  reduce.outputs = {"m"};
  reduce.attrs["axes"] = std::vector<int64_t>{1};
  g.nodes = {split, reduce};
  g.outputs = {ir::ValueInfo{"a", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{2, ""}, ir::Dim{2, ""}}},
               ir::ValueInfo{"m", DType::kFloat32, std::vector<ir::Dim>{ir::Dim{2, ""}, ir::Dim{1, ""}}}};
  Tensor x(DType::kFloat32, {2, 6});
  for (int64_t i = 0; i < 12; ++i) x.data<float>()[i] = static_cast<float>(i * i) - 3.f;
  const auto before = runtime::Session(g).run({{"x", x}});

  ir::Graph raised = g;
  ir::convert_opset(raised, 21);
  EXPECT_EQ(raised.opset, 21);
  const ir::Node& raised_split = raised.nodes[static_cast<size_t>(raised.producer("a"))];
  EXPECT_EQ(raised_split.attr_int("num_outputs", 0), 3);
  const ir::Node& raised_mean = raised.nodes[static_cast<size_t>(raised.producer("m"))];
  EXPECT_FALSE(raised_mean.has_attr("axes"));
  ASSERT_EQ(raised_mean.inputs.size(), 2u);
  ASSERT_TRUE(raised.is_initializer(raised_mean.inputs[1]));
  EXPECT_EQ(raised.initializer(raised_mean.inputs[1])->to_int64_vector(), (std::vector<int64_t>{1}));
  ir::save_onnx(raised, tmp.path("raised.onnx"));
  const ir::Graph loaded = ir::load_onnx(tmp.path("raised.onnx"));
  EXPECT_EQ(loaded.opset, 21);
  const auto after = runtime::Session(loaded).run({{"x", x}});
  for (const char* name : {"a", "m"}) {
    EXPECT_EQ(after.at(name).shape(), before.at(name).shape()) << name;
    EXPECT_EQ(after.at(name).to_float_vector(), before.at(name).to_float_vector()) << name;
  }
}

// Split's num_outputs (opset 18): read at any opset up to 21, with the last part smaller when the
// axis does not divide (7 = 3 + 3 + 1).
TEST(Opset21, SplitByCountLoadsAndMakesTheLastPartSmaller) {
  test::TempDir tmp("opset18_split");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(18);
  onnx::GraphProto* gp = m.mutable_graph();
  gp->set_name("split_by_count");
  onnx::ValueInfoProto* in = gp->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {2, 7}) in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  onnx::NodeProto* n = gp->add_node();
  n->set_op_type("Split");
  n->set_name("split");
  n->add_input("x");
  for (const char* o : {"a", "b", "c"}) {
    n->add_output(o);
    onnx::ValueInfoProto* out = gp->add_output();
    out->set_name(o);
    out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  onnx::AttributeProto* axis = n->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  onnx::AttributeProto* count = n->add_attribute();
  count->set_name("num_outputs");
  count->set_type(onnx::AttributeProto::INT);
  count->set_i(3);
  std::ofstream(tmp.path("split.onnx"), std::ios::binary) << m.SerializeAsString();
  const ir::Graph g = ir::load_onnx(tmp.path("split.onnx"));
  Tensor x(DType::kFloat32, {2, 7});
  for (int64_t i = 0; i < 14; ++i) x.data<float>()[i] = static_cast<float>(i);
  const auto out = runtime::Session(g).run({{"x", x}});
  EXPECT_EQ(out.at("a").shape(), (Shape{2, 3}));
  EXPECT_EQ(out.at("b").shape(), (Shape{2, 3}));
  EXPECT_EQ(out.at("c").shape(), (Shape{2, 1}));
  EXPECT_EQ(out.at("c").to_float_vector(), (std::vector<float>{6.f, 13.f}));
  EXPECT_EQ(out.at("b").to_float_vector(), (std::vector<float>{3.f, 4.f, 5.f, 10.f, 11.f, 12.f}));
}

}  // namespace

namespace {

// An opset-19 model x[1,1,4,4] -> AveragePool 2x2 -> Resize x2 (linear), with or without the newer
// attributes written out at their default values, as exporters write them.
std::string pool_resize_model(bool explicit_defaults, int64_t antialias) {
  onnx::ModelProto m;
  m.set_ir_version(9);
  m.add_opset_import()->set_version(19);
  onnx::GraphProto* gp = m.mutable_graph();
  gp->set_name("pool_resize");
  auto add_value = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) v->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  };
  add_value(gp->add_input(), "x", {1, 1, 4, 4});
  add_value(gp->add_output(), "y", {1, 1, 4, 4});
  auto attr = [](onnx::NodeProto* n, const char* name) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    return a;
  };
  onnx::NodeProto* pool = gp->add_node();
  pool->set_op_type("AveragePool");
  pool->set_name("pool");
  pool->add_input("x");
  pool->add_output("p");
  onnx::AttributeProto* kernel = attr(pool, "kernel_shape");
  kernel->set_type(onnx::AttributeProto::INTS);
  kernel->add_ints(2);
  kernel->add_ints(2);
  onnx::AttributeProto* strides = attr(pool, "strides");
  strides->set_type(onnx::AttributeProto::INTS);
  strides->add_ints(2);
  strides->add_ints(2);
  onnx::TensorProto* scales = gp->add_initializer();
  scales->set_name("scales");
  scales->set_data_type(onnx::TensorProto::FLOAT);
  scales->add_dims(4);
  for (float v : {1.f, 1.f, 2.f, 2.f}) scales->add_float_data(v);
  onnx::NodeProto* resize = gp->add_node();
  resize->set_op_type("Resize");
  resize->set_name("resize");
  resize->add_input("p");
  resize->add_input("");
  resize->add_input("scales");
  resize->add_output("y");
  onnx::AttributeProto* mode = attr(resize, "mode");
  mode->set_type(onnx::AttributeProto::STRING);
  mode->set_s("linear");
  if (explicit_defaults) {
    onnx::AttributeProto* dilations = attr(pool, "dilations");
    dilations->set_type(onnx::AttributeProto::INTS);
    dilations->add_ints(1);
    dilations->add_ints(1);
    onnx::AttributeProto* aa = attr(resize, "antialias");
    aa->set_type(onnx::AttributeProto::INT);
    aa->set_i(antialias);
    onnx::AttributeProto* policy = attr(resize, "keep_aspect_ratio_policy");
    policy->set_type(onnx::AttributeProto::STRING);
    policy->set_s("stretch");
  }
  return m.SerializeAsString();
}

TEST(Opset21, NewerAttributesAtTheirDefaultValuesLoadAndMeanWhatTheirAbsenceMeant) {
  test::TempDir tmp("opset19_defaults");
  std::ofstream(tmp.path("plain.onnx"), std::ios::binary) << pool_resize_model(false, 0);
  std::ofstream(tmp.path("explicit.onnx"), std::ios::binary) << pool_resize_model(true, 0);
  std::ofstream(tmp.path("antialias.onnx"), std::ios::binary) << pool_resize_model(true, 1);
  Tensor x(DType::kFloat32, {1, 1, 4, 4});
  for (int64_t i = 0; i < 16; ++i) x.data<float>()[i] = static_cast<float>(i * 3 % 7);
  const Tensor plain = runtime::Session(ir::load_onnx(tmp.path("plain.onnx"))).run({{"x", x}}).at("y");
  const Tensor explicit_defaults = runtime::Session(ir::load_onnx(tmp.path("explicit.onnx"))).run({{"x", x}}).at("y");
  EXPECT_EQ(explicit_defaults.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(explicit_defaults.to_float_vector(), plain.to_float_vector());
  try {
    ir::load_onnx(tmp.path("antialias.onnx"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'resize' (Resize)"), std::string::npos) << e.what();
  }
}

}  // namespace
