# Enables CUDA in the including directory, C++20. Default targets: sm_90a (Hopper: the wgmma / TMA
# kernels need the arch-specific target; CMake turns "90a" into
# -gencode=arch=compute_90a,code=sm_90a) and sm_80 with its PTX (the mma.sync kernels: Ampere and
# Ada run its machine code, later GPUs compile the PTX when loaded). CMake 3.25 detects no CUDA20
# dialect flag for nvcc 13 (its probe of older dialects fails), so the flag is given here; newer
# CMake agrees.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90a)
endif()
enable_language(CUDA)
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
