// wgmma_sm90.cuh — Hopper (sm_90a) warpgroup MMA building blocks: the 128-byte-swizzled
// shared-memory tile layout, its matrix descriptors, the wgmma instructions the forward kernel
// uses and their fences. Compiled only for sm_90a (wgmma is an arch-specific feature).
//
// Tile layout ("128B swizzle" in PTX terms). A tile of R rows x C bf16 columns (C = 64 or 128,
// R a multiple of 8) is stored as C / 64 column blocks of R x 64; block b holds columns
// [64 b, 64 b + 64) and starts at byte b * R * 128. In a block, row r is one 128-byte line at
// r * 128, and its 16-byte chunk c (columns 8c .. 8c + 7 of the block) sits at chunk slot
// c ^ (r & 7). The hardware swizzle is a function of the address: it XORs address bits [4, 7)
// with bits [7, 10) inside each 1024-byte atom (8 lines). The stored layout equals it as long
// as every tile starts 1024-byte aligned, which the kernel guarantees.
//
// Descriptors (PTX "matrix descriptor": bits 0-13 start address >> 4, 16-29 leading byte
// offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 swizzle, 1 = 128B):
// - K-major operand (rows = M or N, contiguous = K): a core matrix is 8 rows x 16 bytes; the
//   8-row groups along M/N are 1024 bytes apart (SBO = 1024); LBO is unused for swizzled
//   K-major layouts (set to 1). One wgmma reads K = 16 columns = 32 bytes of each row; k step
//   kk of a 64-column block starts at +32 kk bytes: the hardware adds the row offset r * 128
//   and then swizzles, giving chunk (2 kk + c) ^ (r & 7), exactly where the tile stored it
//   (the start's bits [7, 10) are zero, so base offset = 0).
// - MN-major operand (V as B of O += P V: K = keys are the rows, N = head dim is contiguous):
//   the swizzle atom is 64 N-elements (one 128-byte line) x 8 K-rows; LBO is the step between
//   64-wide N blocks (the column-block stride, R * 128 bytes), SBO the step between 8-row
//   K groups (1024 bytes). k step kk (16 keys) starts at +kk * 16 * 128 bytes (atom aligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_common.cuh"

namespace dcp::cuda::detail {

inline constexpr int kSw128AtomBytes = 1024;  // 8 rows x 128 bytes

// The dynamic shared memory from its first 1024-byte boundary on (swizzle atoms must start
// there; kernels allocate kSw128AtomBytes of slack for it): a pointer and its shared address.
struct SmemBase {
  unsigned char* ptr;
  uint32_t addr;
};
// Bytes from shared address raw_addr up to the next 1024-byte boundary.
__device__ __forceinline__ uint32_t sw128_pad(uint32_t raw_addr) {
  return ((raw_addr + kSw128AtomBytes - 1) & ~static_cast<uint32_t>(kSw128AtomBytes - 1)) - raw_addr;
}
__device__ __forceinline__ SmemBase sw128_smem_base(unsigned char* raw) {
  const uint32_t raw_addr = smem_addr(raw);
  const uint32_t pad = sw128_pad(raw_addr);
  return SmemBase{raw + pad, raw_addr + pad};
}

// Byte offset of element (row, col) in a swizzled tile of kTileRows rows.
template <int kTileRows>
__device__ __forceinline__ uint32_t sw128_offset(int row, int col) {
  const int block = col >> 6;
  const int chunk = ((col >> 3) & 7) ^ (row & 7);
  return static_cast<uint32_t>(block * kTileRows * 128 + row * 128 + chunk * 16 + (col & 7) * 2);
}

__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_byte_addr >> 4) & 0x3FFFU) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFU) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFU) << 32) | (uint64_t{1} << 62);
}

// A descriptor moved by `bytes` (a multiple of 16) within shared memory. Only the start-address
// field (bits 0-13: address / 16) changes, and shared addresses stay below 2^18 bytes, so the
// field never carries into the next one: one addition instead of rebuilding every field. The
// tile's own descriptor is then common to all k steps of a product and computed once, which
// keeps the uniform-datapath work between two wgmma issues small.
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// K-major operand at k step kk (16 columns) of a tile with kTileRows rows; `row0` (a multiple
// of 8) selects the first M/N row the instruction reads (a warpgroup's 64 q rows).
template <int kTileRows>
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile, int row0, int kk) {
  return desc_add(sw128_desc(tile, 16, kSw128AtomBytes),
                  static_cast<uint32_t>((kk >> 2) * kTileRows * 128 + row0 * 128 + (kk & 3) * 32));
}

// MN-major operand at k step kk (16 rows of the tile) of a tile with kTileRows rows.
template <int kTileRows>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, int kk) {
  return desc_add(sw128_desc(tile, kTileRows * 128, kSw128AtomBytes), static_cast<uint32_t>(kk * 16 * 128));
}

// The warpgroup of consumer thread `ctid` (threads 128 wg .. 128 wg + 127), read through a shuffle
// from lane 0: the compiler then knows it is the same in every lane of the warp, so the operand
// descriptors built from it (a warpgroup's 64 rows of a tile) are computed in uniform registers at
// each wgmma instead of kept in vector registers and moved over by R2UR, two per instruction.
__device__ __forceinline__ int warpgroup_of(int ctid) { return __shfl_sync(0xffffffffU, ctid >> 7, 0); }

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes generic-proxy writes to shared memory (cp.async, st.shared) visible to the async proxy
// (wgmma operand reads); each writing thread runs it before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads or writes of accumulator registers across the
// wgmma issue / wait pair (the asm statements below only say "+f" at issue time).
template <int kN>
__device__ __forceinline__ void fence_regs(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D (64 x 128, fp32) = A (64 x 16, smem, K-major) * B (16 x 128, smem, K-major) [+ D if scale_d].
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D (64 x 128, fp32) += A (64 x 16, bf16 registers) * B (16 x 128, smem, MN-major: imm-trans-b = 1);
// scale_d = 0: D = A B (the accumulators are not read).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// D (64 x 64, fp32) += A (64 x 16, bf16 registers) * B (16 x 64, smem, MN-major: imm-trans-b = 1);
// scale_d as above.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
// Rows [0, kR) of a [tokens][heads][kD] bf16 buffer (row stride `stride` elements; rows at or
// past `valid_rows` zero-filled) into a swizzled kR-row tile by all kThreads threads of the CTA,
// 16 bytes per cp.async, unrolled (the loaders of the kernels without a producer warpgroup).
template <int kR, int kD, int kThreads>
__device__ __forceinline__ void load_rows_sw128(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid_rows) {
  constexpr int kChunks = kD / 8;
  constexpr int kPerThread = kR * kChunks / kThreads;
  static_assert(kR * kChunks % kThreads == 0, "every thread loads the same number of chunks");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int row = idx / kChunks;
    const int col = (idx % kChunks) * 8;
    const bool valid = row < valid_rows;
    cp_async16(tile + sw128_offset<kR>(row, col), src + (valid ? row * stride + col : 0), valid);
  }
}

// Rows [0, kR) of a [tokens][heads][kD] bf16 buffer (row stride `stride` elements; rows at or
// past valid_rows zero-filled) into a swizzled kR-row tile by kThreads producer threads (a
// warpgroup's 128 by default; thread ptid), 16 bytes per cp.async. Not unrolled: producers live
// on few registers and have time to spare.
template <int kR, int kD, int kThreads = 128>
__device__ __forceinline__ void producer_load_rows(uint32_t tile, const __nv_bfloat16* src, int64_t stride,
                                                   int valid_rows, int ptid) {
  constexpr int kChunks = kD / 8;
  static_assert(kThreads % kChunks == 0, "whole rows per pass");
  constexpr int kStep = kThreads / kChunks;
  const int col = (ptid % kChunks) * 8;
#pragma unroll 1
  for (int row = ptid / kChunks; row < kR; row += kStep) {
    const bool valid = row < valid_rows;
    cp_async16(tile + sw128_offset<kR>(row, col), src + (valid ? row * stride + col : 0), valid);
  }
}

}  // namespace dcp::cuda::detail
