# CUDA kernel benchmarks (only with DCP_HAVE_CUDA; the kernels are in dcp_exec_cuda).
include(${PROJECT_SOURCE_DIR}/src/exec/cuda/cuda_setup.cmake)
add_executable(bench_cuda_attention bench_cuda_attention.cu)
target_link_libraries(bench_cuda_attention PRIVATE dcp::cuda)
target_compile_options(bench_cuda_attention PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow>)
