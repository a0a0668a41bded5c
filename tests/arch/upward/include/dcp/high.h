// The part above it.
#pragma once
#include "dcp/low.h"
