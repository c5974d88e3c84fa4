// Shape and data-movement kernels (kernels/shape/): one line per op.
#include "runtime/kernels/register_all.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime {

void register_shape_kernels(KernelRegistry& r) {
  using namespace shape;
  r.add("Reshape", make_reshape);
  r.add("Flatten", make_flatten);
  r.add("Squeeze", make_squeeze);
  r.add("Unsqueeze", make_unsqueeze);
  r.add("Identity", make_identity);
  r.add("Dropout", make_dropout);
  r.add("Shape", make_shape);
  r.add("Size", make_size);
  r.add("Transpose", make_transpose);
  r.add("DepthToSpace", make_depth_to_space, "", layouts::kChannelBlockedToPlain);
  r.add("SpaceToDepth", make_space_to_depth);
  // Each input's channels are quantized straight into their place in the output.
  r.add("Concat", make_concat, "", layouts::kChannelBlocked, KernelFolds{.channel_quantize = true});
  r.add("Split", make_split);
  r.add("Slice", make_slice);
  r.add("Gather", make_gather);
  r.add("GatherElements", make_gather_elements);
  r.add("Pad", make_pad);
  r.add("Expand", make_expand);
  r.add("Tile", make_tile);
  r.add("Trilu", make_trilu);
  // A QuantizeLinear after a Resize (U-Net and FPN upsampling into a quantized Concat) folds into it.
  r.add("Resize", make_resize, "", layouts::kChannelBlocked, KernelFolds{.tensor_quantize = true});
  r.add("Upsample", make_upsample, "", {}, KernelFolds{.tensor_quantize = true});
  r.add("Constant", make_constant);
  r.add("ConstantOfShape", make_constant_of_shape);
  r.add("Range", make_range);
  r.add("OneHot", make_one_hot);
}

}  // namespace slimquant::runtime
