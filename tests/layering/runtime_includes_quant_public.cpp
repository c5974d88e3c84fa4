// Layering probe (must not compile): the runtime including a public header of a layer above it.
#include "slimquant/quant/ptq.h"
