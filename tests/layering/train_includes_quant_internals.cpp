// Layering probe (must not compile): train reaching into quant's internals outside its detail interface.
#include "quant/observers/observer_internal.h"
