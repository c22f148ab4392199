# The CUDA backend: a library of its own, ascender_cuda (CMake target ascender::cuda), as libtorch_cuda is to
# libtorch_cpu. The library ascender is the CPU backend and needs no CUDA library to build against or to run; the
# CUDA library adds the GPU path of every op by registering, as it loads, the table of its kernels and its runtime
# (cuda/backend.cpp, cuda/runtime_api.h). Nothing in ascender names a symbol of it, so a linker would drop it:
# ascender::cuda links the static library whole-archive, and ascender::cuda_shared (cmake/install.cmake) asks for
# --no-as-needed.
#
# It is compiled whenever nvcc is present, even on machines without a GPU, so that CUDA compile and link breakage
# shows up in CI; at run time the backend serves tensors only when a device is actually available.
set(ASC_HAVE_CUDA OFF)
set(ASC_HAVE_NCCL OFF)
# The backend's sources, for nvcc or for the emulator. Two files of cuda/ belong to the CPU library (CMakeLists.txt):
# the public API (api.cpp) and the caching allocator's policy (tested with a mock device in every build).
file(GLOB ASC_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cu)
file(GLOB ASC_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cpp)
list(REMOVE_ITEM ASC_CUDA_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cuda/caching_allocator.cpp
     ${CMAKE_CURRENT_SOURCE_DIR}/cuda/api.cpp)
list(APPEND ASC_CUDA_SOURCES ${ASC_CU_SOURCES})
option(ASC_CUDA_EMULATION "Compile cuda/ with the host compiler against the CPU CUDA emulator (tests/cuda_emu)" OFF)

# The library and its whole-archive link target, once the sources are known to compile somewhere.
macro(asc_add_cuda_library)
  add_library(ascender_cuda_static STATIC ${ASC_CUDA_SOURCES})
  set_target_properties(ascender_cuda_static PROPERTIES OUTPUT_NAME ascender_cuda EXPORT_NAME cuda_static)
  target_link_libraries(ascender_cuda_static PUBLIC ascender)
  target_compile_definitions(ascender_cuda_static PUBLIC ASC_HAVE_CUDA=1)
  target_compile_options(ascender_cuda_static PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    target_compile_options(ascender_cuda_static PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O3>)
  endif()
  if(ASC_BUILD_SHARED)
    set_target_properties(ascender_cuda_static PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  add_library(ascender_cuda INTERFACE)
  set_target_properties(ascender_cuda PROPERTIES EXPORT_NAME cuda)
  target_link_libraries(ascender_cuda INTERFACE
                        "$<BUILD_INTERFACE:$<LINK_LIBRARY:WHOLE_ARCHIVE,ascender_cuda_static>>"
                        "$<INSTALL_INTERFACE:$<LINK_LIBRARY:WHOLE_ARCHIVE,ascender::cuda_static>>")
  add_library(ascender::cuda ALIAS ascender_cuda)
endmacro()

if(ASC_CUDA_EMULATION)
  # A test build: the CUDA sources compiled by g++ against tests/cuda_emu/include (the CUDA runtime / cuBLAS / cuDNN
  # API on the CPU) and linked with the emulator (target asc_cuda_emu): every kernel runs, thread by thread, on
  # machines without a GPU. See tests/cuda_emu/README.md. No nvcc, libcudart or libcublas is involved. The stand-in
  # headers are an include path of the CUDA sources only, never of the library's consumers.
  add_subdirectory(${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu)
  set_source_files_properties(${ASC_CU_SOURCES} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "-xc++;-Wno-unknown-pragmas")
  set_property(SOURCE ${ASC_CUDA_SOURCES} APPEND PROPERTY INCLUDE_DIRECTORIES ${ASC_CUDA_EMU_INCLUDE})
  # IEEE results as the __*_rn intrinsics promise: never contract a*b+c into an FMA.
  set_property(SOURCE ${ASC_CUDA_SOURCES} APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
  asc_add_cuda_library()
  target_link_libraries(ascender_cuda_static PRIVATE asc_cuda_emu)
  target_compile_definitions(ascender_cuda_static PRIVATE ASC_CUDA_EMULATION=1)
  target_compile_definitions(ascender_cuda_static PUBLIC ASC_HAVE_CUDNN=1)  # the emulator has the cuDNN subset
  set(ASC_HAVE_CUDA ON)
  message(STATUS "ascender: CUDA backend compiled for the CPU CUDA emulator (tests/cuda_emu): no GPU is used")
elseif(ASC_WITH_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Ampere and Hopper; override with -DCMAKE_CUDA_ARCHITECTURES=... or the environment's CUDAARCHS (CMake's own
    # variable; CI compiles one architecture: no GPU runs its code there, and the compile check is the same).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(ASC_HAVE_CUDA ON)
  else()
    message(STATUS "ascender: nvcc not found, building the CPU backend only")
  endif()
endif()

if(ASC_HAVE_CUDA AND NOT ASC_CUDA_EMULATION)
  # NCCL (the "nccl" process group, cuda/process_group_nccl.cpp) when its header and library are present and MPI,
  # which starts the ranks and hands them NCCL's id, was found too. It implements the process-group interface of the
  # trainer library (train/process_group.h) and lives with the CUDA sources because it links CUDA.
  find_path(ASC_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(ASC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(ASC_NCCL_INCLUDE AND ASC_NCCL_LIBRARY AND MPI_CXX_FOUND)
    list(APPEND ASC_CUDA_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cuda/process_group_nccl.cpp)
    set(ASC_HAVE_NCCL ON)
  endif()
  asc_add_cuda_library()
  # .cu files compile as C++17: under nvcc's C++20 mode fmt's consteval format-string checks fail to evaluate
  # (and CMake 3.25 knows no CUDA20 dialect). Headers that .cu files include stay C++17-clean; the C++ sources of
  # cuda/ (*.cpp) are ordinary C++20.
  set_target_properties(ascender_cuda_static PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                                                        CUDA_STANDARD 17)
  target_compile_options(ascender_cuda_static PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  # nvcc's host pass turns a __device__ function into a stub that exits the program (and one with a deduced return
  # type into a void one): host code calling one compiles without a word and fails only on a GPU. With this option
  # nvcc keeps the host-pass sources in <build>/nvcc_keep and the test cuda_host_pass reads them
  # (tools/check_cuda_host_pass.py). On in the release preset, which CI builds.
  option(ASC_CUDA_KEEP_HOST_PASS "Keep nvcc's host-pass sources and test them for calls of __device__ functions" OFF)
  if(ASC_CUDA_KEEP_HOST_PASS)
    set(ASC_NVCC_KEEP_DIR ${CMAKE_BINARY_DIR}/nvcc_keep)
    file(MAKE_DIRECTORY ${ASC_NVCC_KEEP_DIR})
    target_compile_options(ascender_cuda_static PRIVATE
                           "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-keep -keep-dir \"${ASC_NVCC_KEEP_DIR}\">")
  endif()
  target_link_libraries(ascender_cuda_static PUBLIC CUDA::cudart CUDA::cublas)
  message(STATUS "ascender: CUDA backend enabled (archs ${CMAKE_CUDA_ARCHITECTURES}): library ascender_cuda")
  # cuDNN (fused attention, cuda/cudnn_sdpa.cpp) when its header and library are present; optional.
  find_path(ASC_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(ASC_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(ASC_CUDNN_INCLUDE AND ASC_CUDNN_LIBRARY)
    target_include_directories(ascender_cuda_static PRIVATE ${ASC_CUDNN_INCLUDE})
    target_link_libraries(ascender_cuda_static PUBLIC ${ASC_CUDNN_LIBRARY})
    target_compile_definitions(ascender_cuda_static PUBLIC ASC_HAVE_CUDNN=1)
    message(STATUS "ascender: cuDNN found (${ASC_CUDNN_LIBRARY}): fused attention enabled")
  else()
    message(STATUS "ascender: cuDNN not found: attention uses the composed kernels")
  endif()
  if(ASC_HAVE_NCCL)
    target_include_directories(ascender_cuda_static PRIVATE ${ASC_NCCL_INCLUDE})
    target_link_libraries(ascender_cuda_static PUBLIC ${ASC_NCCL_LIBRARY})
    target_compile_definitions(ascender_cuda_static PRIVATE ASC_HAVE_NCCL=1)
    message(STATUS "ascender: NCCL found (${ASC_NCCL_LIBRARY}): the nccl process group is built")
  else()
    message(STATUS "ascender: no NCCL (or no MPI): no nccl process group")
  endif()
endif()
