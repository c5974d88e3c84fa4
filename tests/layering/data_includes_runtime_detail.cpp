// Layering probe (must not compile): data does not use the runtime, so not its detail interface either.
#include "runtime/kernels/integer/int8_common.h"
