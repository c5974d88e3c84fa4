// Layering probe (must not compile): data does not use the runtime, so not its detail interface either.
#include "runtime/kernels/int8_common.h"
