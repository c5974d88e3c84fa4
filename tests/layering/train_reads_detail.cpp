// Layering probe (must compile): what train may include, so the failing probes fail for the
// include alone, not for a broken setup.
#include "quant/qdq_export.h"
#include "runtime/dnnl_context.h"
#include "runtime/fused_ops/gelu_erf.h"
#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/core/tensor.h"
#include "slimquant/data/dataset.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"
#include "slimquant/train/qat.h"
#include "train/op_base.h"
