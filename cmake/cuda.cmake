# The CUDA backend (cuda/) is compiled whenever nvcc is present, even on machines without a GPU, so that
# CUDA compile and link breakage shows up in CI. At run time the backend registers itself only when a device
# is actually available; everything else runs on the CPU.
set(ASC_HAVE_CUDA OFF)
if(ASC_WITH_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)   # Ampere and Hopper; override with -DCMAKE_CUDA_ARCHITECTURES=...
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(ASC_HAVE_CUDA ON)
  else()
    message(STATUS "ascender: nvcc not found, building the CPU backend only")
  endif()
endif()

if(ASC_HAVE_CUDA)
  file(GLOB ASC_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cu ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cpp)
  list(REMOVE_ITEM ASC_CUDA_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cuda/caching_allocator.cpp)  # in every build
  target_sources(ascender PRIVATE ${ASC_CUDA_SOURCES})
  # .cu files compile as C++17: under nvcc's C++20 mode fmt's consteval format-string checks fail to evaluate
  # (and CMake 3.25 knows no CUDA20 dialect). Headers that .cu files include stay C++17-clean; the C++ sources of
  # cuda/ (*.cpp) are ordinary C++20.
  set_target_properties(ascender PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 17)
  target_compile_options(ascender PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  target_link_libraries(ascender PUBLIC CUDA::cudart CUDA::cublas)
  target_compile_definitions(ascender PUBLIC ASC_HAVE_CUDA=1)
  message(STATUS "ascender: CUDA backend enabled (archs ${CMAKE_CUDA_ARCHITECTURES})")
endif()
