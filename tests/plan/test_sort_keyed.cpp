// The schedule's keyed sorts (src/schedule/schedule_internal.h): a packed key orders as the
// fields' tuple, and sorting by it gives std::sort's order with the tuple comparator, equal
// elements included (they differ here in via_relay, which no key sees).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "schedule/schedule_internal.h"

namespace dcp {
namespace {

TEST(KeyPacker, OrdersAsTheTupleOfItsFields) {
  const sched::KeyPacker packer{7, 300, 1, 0, 65535};
  ASSERT_TRUE(packer.fits());
  std::mt19937_64 rng(5);
  auto field = [&](int64_t max) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(max + 1)); };
  for (int i = 0; i < 20000; ++i) {
    const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t> a{field(7), field(300), field(1), 0, field(65535)};
    const std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t> b{field(7), field(300), field(1), 0, field(65535)};
    const auto ka = packer.pack({std::get<0>(a), std::get<1>(a), std::get<2>(a), std::get<3>(a), std::get<4>(a)});
    const auto kb = packer.pack({std::get<0>(b), std::get<1>(b), std::get<2>(b), std::get<3>(b), std::get<4>(b)});
    EXPECT_EQ(ka < kb, a < b);
    EXPECT_EQ(ka == kb, a == b);
  }
}

TEST(KeyPacker, SaysWhenTheFieldsNeedMoreThan64Bits) {
  EXPECT_TRUE((sched::KeyPacker{(int64_t{1} << 32) - 1, (int64_t{1} << 32) - 1}.fits()));
  EXPECT_FALSE((sched::KeyPacker{int64_t{1} << 32, (int64_t{1} << 32) - 1}.fits()));
  EXPECT_THROW((sched::KeyPacker{3}.pack({4})), Error);  // a field past its width is refused
}

TEST(SortKeyed, GivesStdSortsOrderEqualElementsIncluded) {
  std::mt19937_64 rng(11);
  auto less = [](const ScheduledTransfer& a, const ScheduledTransfer& b) {
    return std::tie(a.round, a.src, a.dst, a.kind, a.token_block, a.group) <
           std::tie(b.round, b.src, b.dst, b.kind, b.token_block, b.group);
  };
  const sched::KeyPacker packer{6, 31, 31, sched::kMaxDataKind, 9, 3};
  auto key = [&](const ScheduledTransfer& x) {
    return packer.pack({x.round, x.src, x.dst, static_cast<int64_t>(x.kind), x.token_block, x.group});
  };
  for (const size_t n : {0U, 1U, 5U, 17U, 100U, 5000U}) {
    std::vector<ScheduledTransfer> v(n);
    for (ScheduledTransfer& x : v) {  // few distinct keys: many equal ones, told apart by via_relay
      x.round = static_cast<int32_t>(rng() % 3);
      x.src = static_cast<int32_t>(rng() % 4);
      x.dst = static_cast<int32_t>(rng() % 4);
      x.kind = static_cast<DataKind>(rng() % 2);
      x.token_block = static_cast<int32_t>(rng() % 10);
      x.group = static_cast<int32_t>(rng() % 2);
      x.via_relay = rng() % 2 == 0;
    }
    std::vector<ScheduledTransfer> want = v;
    std::sort(want.begin(), want.end(), less);
    std::vector<ScheduledTransfer> keyed = v;
    sched::sort_keyed(keyed, true, key, less);
    EXPECT_EQ(keyed, want) << n << " transfers";
    std::vector<ScheduledTransfer> unkeyed = v;
    sched::sort_keyed(unkeyed, false, key, less);
    EXPECT_EQ(unkeyed, want) << n << " transfers";
  }
}

}  // namespace
}  // namespace dcp
