// tensor_map.cpp — see tensor_map.h.
#include "tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "dcp/error.h"

namespace dcp::cuda::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool encode_tensor_map_2d(CUtensorMap& map, const char* what, TensorElem elem, const void* base, int64_t row_elems,
                          int64_t rows, int box_cols, int box_rows) {
  const int64_t elem_bytes = elem == TensorElem::Bf16 ? 2 : 4;
  if (rows <= 0 || row_elems <= 0 || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      (row_elems * elem_bytes) % 16 != 0) {
    return false;
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_elems), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_elems * elem_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUtensorMapDataType type = elem == TensorElem::Bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : elem == TensorElem::I32 ? CU_TENSOR_MAP_DATA_TYPE_INT32
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const CUresult r = encode(&map, type,
                            2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    raise(ErrorKind::Cuda, std::string(what) + ": cuTensorMapEncodeTiled failed (error " + std::to_string(r) + ") for a " +
                               std::to_string(rows) + " x " + std::to_string(row_elems) + " buffer, box " +
                               std::to_string(box_rows) + " x " + std::to_string(box_cols));
  }
  return true;
}

}  // namespace dcp::cuda::detail
