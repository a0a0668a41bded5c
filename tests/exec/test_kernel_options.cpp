// The CUDA backend's kernel options as the command line, the GPU checks and the Python package
// spell them (built with or without CUDA): every accepted spelling, and a refusal that names the
// variable and the accepted values.
#include <gtest/gtest.h>

#include <string>

#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace {

void expect_refused(void (*parse)(), const std::string& where) {
  try {
    parse();
    ADD_FAILURE() << "accepted a bad value for " << where;
  } catch (const dcp::Error& e) {
    EXPECT_EQ(e.kind(), dcp::ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
  }
}

TEST(KernelOptions, SpellingsRoundTripAndBadValuesNameTheirSource) {
  for (const dcp::KernelRoute r :
       {dcp::KernelRoute::Auto, dcp::KernelRoute::Mma, dcp::KernelRoute::Wgmma, dcp::KernelRoute::WgmmaBasic})
    EXPECT_EQ(dcp::parse_kernel_route(dcp::to_string(r), "X"), r);
  EXPECT_EQ(dcp::parse_kernel_route("", "X"), dcp::KernelRoute::Auto);
  EXPECT_EQ(dcp::parse_dq_reduction("", "X"), dcp::DqReduction::Bulk);
  EXPECT_EQ(dcp::parse_dq_reduction("atomic", "X"), dcp::DqReduction::Atomic);
  for (const char* on : {"1", "on", "true"}) EXPECT_TRUE(dcp::parse_switch(on, "X"));
  for (const char* off : {"", "0", "off", "false"}) EXPECT_FALSE(dcp::parse_switch(off, "X"));
  EXPECT_EQ(dcp::parse_row_count("", "X"), 0);
  EXPECT_EQ(dcp::parse_row_count("4096", "X"), 4096);
  expect_refused([] { (void)dcp::parse_kernel_route("wgmma2", "DCP_ATTN_FORWARD"); }, "DCP_ATTN_FORWARD");
  expect_refused([] { (void)dcp::parse_dq_reduction("fast", "DCP_ATTN_BACKWARD_DQ"); }, "DCP_ATTN_BACKWARD_DQ");
  expect_refused([] { (void)dcp::parse_switch("yes please", "DCP_ATTN_DETERMINISTIC"); }, "DCP_ATTN_DETERMINISTIC");
  expect_refused([] { (void)dcp::parse_row_count("-1", "DCP_ATTN_DETERMINISTIC_UNIT_ROWS"); }, "DCP_ATTN_DETERMINISTIC_UNIT_ROWS");
  expect_refused([] { (void)dcp::parse_row_count("4k", "DCP_ATTN_DETERMINISTIC_UNIT_ROWS"); }, "DCP_ATTN_DETERMINISTIC_UNIT_ROWS");
}

// The deterministic backward: a switch keeps the configured method; a method's name turns it on.
TEST(KernelOptions, DeterministicTakesASwitchOrAMethod) {
  for (const dcp::DeterministicMethod m : {dcp::DeterministicMethod::Ordered, dcp::DeterministicMethod::Split}) {
    dcp::CudaKernelOptions k;
    dcp::parse_deterministic(dcp::to_string(m), "X", k);
    EXPECT_TRUE(k.deterministic_backward);
    EXPECT_EQ(k.deterministic_method, m);
  }
  dcp::CudaKernelOptions k;
  const dcp::DeterministicMethod method = k.deterministic_method;
  dcp::parse_deterministic("on", "X", k);
  EXPECT_TRUE(k.deterministic_backward);
  EXPECT_EQ(k.deterministic_method, method);
  dcp::parse_deterministic("", "X", k);
  EXPECT_FALSE(k.deterministic_backward);
  expect_refused([] {
    dcp::CudaKernelOptions o;
    dcp::parse_deterministic("sorted", "DCP_ATTN_DETERMINISTIC", o);
  }, "DCP_ATTN_DETERMINISTIC");
}

}  // namespace
