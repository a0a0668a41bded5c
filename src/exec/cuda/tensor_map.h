// tensor_map.h — host-side encoding of the 2-D tensor maps the Hopper kernels hand to the tensor
// memory accelerator (TMA): a row-major [rows][row_elems] buffer read or reduced in boxes of
// box_rows x box_cols elements with the 128-byte swizzle (the shared-memory layout of
// wgmma_sm90.cuh). The encoder is reached through the CUDA runtime's driver entry point, so
// nothing links against the driver library.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dcp::cuda::detail {

// I32: the element type of a reduction's integer add (the one-pass deterministic backward's dQ).
enum class TensorElem { Bf16, F32, I32 };

// False when the map cannot be made here (no driver encoder, rows unknown (0), base not 16-byte
// aligned, or a row pitch that is not a multiple of 16 bytes): the caller then takes its non-TMA
// path. An encoder failure on valid-looking input raises ErrorKind::Cuda naming `what`.
bool encode_tensor_map_2d(CUtensorMap& map, const char* what, TensorElem elem, const void* base, int64_t row_elems,
                          int64_t rows, int box_cols, int box_rows);

}  // namespace dcp::cuda::detail
