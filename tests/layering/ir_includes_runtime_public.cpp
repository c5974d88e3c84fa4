// Layering probe (must not compile): ir including a public header of a layer above it.
#include "slimquant/runtime/session.h"
