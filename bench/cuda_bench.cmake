# CUDA kernel benchmarks (only with DCP_HAVE_CUDA; CUDA is enabled by src/exec/cuda).
enable_language(CUDA)
add_executable(bench_cuda_attention bench_cuda_attention.cu)
target_link_libraries(bench_cuda_attention PRIVATE dcp_cuda)
target_compile_options(bench_cuda_attention PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Xcompiler=-Wall,-Wextra,-Wshadow>)
