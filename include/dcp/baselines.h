// dcp/baselines.h — static context parallelism expressed as placements, so that the same
// metrics, simulator and executor judge every method.
//
//   ring     : each sequence cut into P contiguous chunks; chunk d homed on device d; queries
//              stay, KV travels (tile on the Q chunk's device).
//   zigzag   : 2P chunks, device d owns chunks d and 2P-1-d (causal balance).
//   ulysses  : heads across devices: u = largest divisor of P that divides the head groups;
//              with u < P the remaining factor P/u is a contiguous ring (USP-style hybrid).
//   a2a_p2p  : heads inside a node (Ulysses over the node's devices), zigzag ring across nodes
//              (TransformerEngine/Megatron hierarchical CP).
//   packing  : whole sequences, longest first onto the least loaded device (pure data parallel).
// Chunk sizes differ by at most one token (the first chunks take the remainder); when a
// sequence has fewer tokens than chunks, the empty chunks are skipped, never padded or rounded.
#pragma once

#include <string>
#include <vector>

#include "dcp/cluster.h"
#include "dcp/placement.h"

namespace dcp {

enum class BaselineKind { Ring, Zigzag, Ulysses, A2AP2P, Packing };
const char* to_string(BaselineKind kind);
std::vector<BaselineKind> all_baselines();

PlacedBatch make_baseline(BaselineKind kind, const Batch& batch, const BlockOptions& opts,
                          const Cluster& cluster);

}  // namespace dcp
