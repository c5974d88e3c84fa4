#include "runtime/kernels/dnnl/dnnl_descriptors.h"

namespace slimquant::runtime::dnnl_kernels {

memory::desc conv_weights_desc(const Shape& w, int64_t group, dt type, memory::format_tag tag) {
  Dims dims;
  if (group > 1) {
    dims.push_back(group);
    dims.push_back(w[0] / group);
  } else {
    dims.push_back(w[0]);
  }
  dims.insert(dims.end(), w.begin() + 1, w.end());
  if (tag == memory::format_tag::undef) tag = plain_tag(dims.size());
  return memory::desc(dims, type, tag);
}

memory::desc conv_transpose_weights_desc(const Shape& w, int64_t group) {
  const int64_t ic_g = w[0] / group, oc_g = w[1];
  int64_t k = 1;
  for (size_t i = 2; i < w.size(); ++i) k *= w[i];
  Dims kernel(w.begin() + 2, w.end());
  Dims kernel_strides(kernel.size());
  int64_t stride = 1;
  for (size_t i = kernel.size(); i-- > 0;) {
    kernel_strides[i] = stride;
    stride *= kernel[i];
  }
  Dims dims, strides;
  if (group > 1) {
    dims = {group, oc_g, ic_g};
    strides = {ic_g * oc_g * k, k, oc_g * k};
  } else {
    dims = {oc_g, ic_g};
    strides = {k, oc_g * k};
  }
  dims.insert(dims.end(), kernel.begin(), kernel.end());
  strides.insert(strides.end(), kernel_strides.begin(), kernel_strides.end());
  return memory::desc(dims, dt::f32, strides);
}

}  // namespace slimquant::runtime::dnnl_kernels
