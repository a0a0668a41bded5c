# CUDA kernel benchmarks (only with DCP_HAVE_CUDA; the kernels are in dcp_exec_cuda).
include(${PROJECT_SOURCE_DIR}/src/exec/cuda/cuda_setup.cmake)
add_executable(bench_cuda_attention bench_cuda_attention.cu ${PROJECT_SOURCE_DIR}/tools/gpu_energy.cpp)
target_include_directories(bench_cuda_attention PRIVATE ${PROJECT_SOURCE_DIR}/tools)
target_link_libraries(bench_cuda_attention PRIVATE dcp::cuda ${CMAKE_DL_LIBS})
target_compile_options(bench_cuda_attention PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow>)
