// Layering probe (must not compile): quant reaching into the runtime's kernels.
#include "runtime/kernels/register_all.h"
