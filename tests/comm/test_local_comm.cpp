// In-process comm: tagged payloads, timeouts, aborts and size mismatches.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "dcp/comm.h"
#include "dcp/error.h"
#include "comm/tagged_exchange.h"

namespace dcp::test {
namespace {

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no dcp::Error thrown";
  return ErrorKind::InvalidInput;
}

TEST(LocalComm, TaggedPayloadsArriveInPlaceAndOrder) {
  for (int n : {1, 2, 3, 4}) {
    std::atomic<int> finished{0};
    run_local_ranks(n, [&](Comm& comm) {
      EXPECT_EQ(comm.world_size(), n);
      tagged_exchange(comm, 4, 3, 10.0);
      comm.barrier(10.0);
      ++finished;
    });
    EXPECT_EQ(finished.load(), n);
  }
}

TEST(LocalComm, RoundIdsCanBeReused) {
  run_local_ranks(2, [](Comm& comm) {
    for (int pass = 0; pass < 3; ++pass) tagged_exchange(comm, 2, 2, 10.0);
  });
}

TEST(LocalComm, MissingSendTimesOut) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(kind_of([] {
              run_local_ranks(2, [](Comm& comm) {
                int x = 0;
                if (comm.rank() == 1) {
                  const CommOp op{0, false, &x, sizeof(x)};
                  comm.start(7, {&op, 1});
                  comm.wait(7, 0.2);
                }
              });
            }),
            ErrorKind::Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(LocalComm, TimedOutRoundCanStillComplete) {
  run_local_ranks(2, [](Comm& comm) {
    int x = 0;
    if (comm.rank() == 0) {
      const CommOp op{1, false, &x, sizeof(x)};
      comm.start(3, {&op, 1});
      EXPECT_THROW(comm.wait(3, 0.05), Error);
    }
    comm.barrier(10.0);
    if (comm.rank() == 1) {
      x = 42;
      const CommOp op{0, true, &x, sizeof(x)};
      comm.start(3, {&op, 1});
    }
    comm.wait(3, 10.0);
    EXPECT_EQ(x, 42);
  });
}

TEST(LocalComm, FailingRankStopsTheOthers) {
  // Rank 0 dies before sending; rank 1 would wait 60 s but stops at once with the abort, and the
  // root cause (rank 0's error) is what run_local_ranks rethrows.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_local_ranks(3, [](Comm& comm) {
      if (comm.rank() == 0) raise(ErrorKind::InvalidInput, "rank 0 fails on purpose");
      int x = 0;
      const CommOp op{0, false, &x, sizeof(x)};
      comm.start(1, {&op, 1});
      comm.wait(1, 60.0);
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("on purpose"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(LocalComm, SizeMismatchIsAnError) {
  EXPECT_EQ(kind_of([] {
              run_local_ranks(2, [](Comm& comm) {
                std::vector<char> buf(16);
                const CommOp op{1 - comm.rank(), comm.rank() == 0, buf.data(), comm.rank() == 0 ? 16 : 8};
                comm.start(0, {&op, 1});
                comm.wait(0, 5.0);
              });
            }),
            ErrorKind::InvalidPlan);
}

TEST(LocalComm, BadOpsAndBarrierTimeout) {
  LocalWorld world(2);
  int x = 0;
  const CommOp self{0, true, &x, 4};
  EXPECT_EQ(kind_of([&] { world.comm(0).start(0, {&self, 1}); }), ErrorKind::InvalidInput);
  const CommOp far{5, true, &x, 4};
  EXPECT_EQ(kind_of([&] { world.comm(0).start(0, {&far, 1}); }), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of([&] { world.comm(0).wait(3, 1.0); }), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of([&] { world.comm(0).barrier(0.1); }), ErrorKind::Timeout);  // rank 1 never comes
  EXPECT_EQ(kind_of([] { LocalWorld bad(0); }), ErrorKind::InvalidInput);
}

}  // namespace
}  // namespace dcp::test
