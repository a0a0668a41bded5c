// dcp/area.h — exact counting of allowed (query, key) pairs inside a rectangle.
//
// The count over rows r in [r0, r1) of max(0, min(uppers(r)) - max(lowers(r))) where every bound
// is affine in r with slope 0 or 1. The integrand is concave and piecewise affine; splitting
// [r0, r1) at every crossing of two bounds leaves affine pieces whose positive part is an
// arithmetic series. With slopes in {0, 1} the envelopes have one kink each, so the cost is
// O(k) for k bounds, independent of the number of rows.
#pragma once

#include <cstdint>
#include <span>

#include "dcp/mask.h"

namespace dcp {

// Pre: lowers and uppers are non-empty, every slope is 0 or 1. r1 <= r0 gives 0.
int64_t affine_area(int64_t r0, int64_t r1, std::span<const AffineBound> lowers,
                    std::span<const AffineBound> uppers);

// Allowed pairs of `piece` inside rows [q0, q1) x keys [k0, k1).
int64_t piece_area(const MaskPiece& piece, int64_t q0, int64_t q1, int64_t k0, int64_t k1);

// Allowed pairs of `piece` inside the causal-diagonal triangle of the square block
// rows [q0, q0+n) x keys [q0, q0+n): keys k <= row.
int64_t piece_area_causal(const MaskPiece& piece, int64_t q0, int64_t n);

}  // namespace dcp
