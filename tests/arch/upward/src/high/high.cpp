#include "dcp/high.h"
