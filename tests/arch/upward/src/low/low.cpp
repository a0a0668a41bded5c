// The upward edge the checker must report: the lower part includes the higher part's header.
#include "dcp/high.h"
