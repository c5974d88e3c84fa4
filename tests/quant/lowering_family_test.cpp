// The lowered families as one table (quant/lowering.h): what the selector, action and report read.
#include <gtest/gtest.h>

#include <onnx/defs/schema.h>

#include <set>

#include "slimquant/quant/lowering.h"
#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/kernel.h"

using namespace slimquant;

TEST(LoweringFamilies, OneEntryPerFamilyNamesTheFloatAndFusedOps) {
  const auto& families = quant::lowered_families();
  ASSERT_EQ(families.size(), 3u);
  std::set<std::string> fused;
  for (const quant::LoweredFamily& f : families) {
    ir::Node n;
    n.op_type = f.float_op;
    EXPECT_EQ(quant::find_lowered_family(n), &f) << f.float_op;
    EXPECT_EQ(&quant::lowered_family(f.op), &f);
    EXPECT_STREQ(quant::lowered_op_type(f.op), f.fused_op);
    n.domain = "com.example";  // only the ONNX op is lowered
    EXPECT_EQ(quant::find_lowered_family(n), nullptr);
    fused.insert(f.fused_op);
    quant::LoweringOptions options;
    EXPECT_TRUE(options.*(f.enabled)) << f.float_op << " is lowered by default";
    quant::LoweringReport report;
    ++(report.*(f.lowered));
    EXPECT_EQ(report.lowered(), 1);
  }
  EXPECT_EQ(fused, (std::set<std::string>{"QConv", "QGemm", "QMatMul"}));
  ir::Node relu;
  relu.op_type = "Relu";
  EXPECT_EQ(quant::find_lowered_family(relu), nullptr);
}

// A family's fused op is named twice: in the lowering table and where its kernel and schema are
// registered (runtime/kernels/integer/int8_families.cpp). The names must agree, or lowering writes
// nodes no kernel runs and ONNX shape inference stops at.
TEST(LoweringFamilies, EveryFusedOpHasAKernelAndASchema) {
  const runtime::KernelRegistry& registry = runtime::KernelRegistry::instance();
  for (const quant::LoweredFamily& f : quant::lowered_families()) {
    EXPECT_NE(registry.find(f.fused_op, ir::kSlimquantDomain), nullptr) << f.fused_op;
    EXPECT_NE(onnx::OpSchemaRegistry::Schema(f.fused_op, 1, ir::kSlimquantDomain), nullptr) << f.fused_op;
  }
  EXPECT_EQ(registry.find("QNoSuchFamily", ir::kSlimquantDomain), nullptr);
}
