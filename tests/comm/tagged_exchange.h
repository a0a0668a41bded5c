// Tagged-payload exchange shared by the local and MPI comm tests: every rank sends every other
// rank a few blocks per round, each filled with (source rank, block id, round), so the receiver
// proves placement and ordering without a reference run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp::test {

struct Tag {
  int32_t source;
  int32_t block;
  int32_t round;
  int32_t word;  // position inside the block
};

// Block sizes differ per (source, destination, block) so that a swapped message is caught.
inline int64_t tagged_words(int src, int dst, int block) { return 1 + (src * 7 + dst * 3 + block * 5) % 11; }

// Runs `num_rounds` rounds; throws dcp::Error(InvalidPlan) naming the first wrong word.
inline void tagged_exchange(Comm& comm, int num_rounds, int blocks_per_pair, double timeout_s) {
  const int me = comm.rank();
  const int n = comm.world_size();
  for (int round = 0; round < num_rounds; ++round) {
    std::vector<std::vector<Tag>> send_bufs, recv_bufs;
    std::vector<CommOp> ops;
    std::vector<std::pair<int, int>> recv_meta;  // (source, block)
    // Receives first on odd rounds: order of sends vs receives inside a round must not matter.
    for (int pass = 0; pass < 2; ++pass) {
      const bool sends = (pass == 0) == (round % 2 == 0);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        for (int b = 0; b < blocks_per_pair; ++b) {
          if (sends) {
            std::vector<Tag> buf(static_cast<size_t>(tagged_words(me, peer, b)));
            for (size_t w = 0; w < buf.size(); ++w) buf[w] = Tag{me, b, round, static_cast<int32_t>(w)};
            send_bufs.push_back(std::move(buf));
          } else {
            recv_bufs.emplace_back(static_cast<size_t>(tagged_words(peer, me, b)), Tag{-1, -1, -1, -1});
            recv_meta.emplace_back(peer, b);
          }
        }
      }
    }
    size_t s = 0, r = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const bool sends = (pass == 0) == (round % 2 == 0);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        for (int b = 0; b < blocks_per_pair; ++b) {
          std::vector<Tag>& buf = sends ? send_bufs[s++] : recv_bufs[r++];
          ops.push_back(CommOp{peer, sends, buf.data(), static_cast<int64_t>(buf.size() * sizeof(Tag))});
        }
      }
    }
    comm.start(round, ops);
    comm.wait(round, timeout_s);
    for (size_t i = 0; i < recv_bufs.size(); ++i)
      for (size_t w = 0; w < recv_bufs[i].size(); ++w) {
        const Tag& t = recv_bufs[i][w];
        const auto [src, block] = recv_meta[i];
        if (t.source != src || t.block != block || t.round != round || t.word != static_cast<int32_t>(w))
          raise(ErrorKind::InvalidPlan, "rank " + std::to_string(me) + " round " + std::to_string(round) +
                                            ": block " + std::to_string(block) + " from rank " + std::to_string(src) +
                                            " word " + std::to_string(w) + " holds (" + std::to_string(t.source) +
                                            ", " + std::to_string(t.block) + ", " + std::to_string(t.round) + ", " +
                                            std::to_string(t.word) + ")");
      }
  }
}

}  // namespace dcp::test
