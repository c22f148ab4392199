# Installing ascender for other projects: `cmake --install build/release --prefix <dir>` puts
#   include/ascender/...                   the public headers, laid out as in the source tree ("core/tensor.h", "ascender.h")
#   lib/libascender.a, lib/libascender.so  the library, static and shared (the same objects, compiled position-independent):
#                                          the CPU backend, which needs no CUDA library at run time
#   lib/libascender_cuda.a, .so            the CUDA backend (when built with nvcc): link it to use GPUs
#   lib/cmake/ascender/                    the CMake package: find_package(ascender CONFIG REQUIRED), then link
#                                          ascender::ascender (static) or ascender::ascender_shared, and add
#                                          ascender::cuda or ascender::cuda_shared for the GPU
#   lib/pkgconfig/ascender.pc, ascender-cuda.pc   for builds without CMake: pkg-config --cflags --libs ascender
# and `cpack -G DEB` (in the build directory) packs the same as Debian packages: libascender-dev (component lib),
# libascender-cuda-dev (component cuda) and ascender-tools (component tools, the command-line tools). examples/ is a
# project of its own built against such an install (tools/check_package.sh, run by the test command).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(ASC_CUDA_EMULATION OR ASC_SANITIZE OR ASC_SANITIZE_THREAD)
  return()  # test builds: nothing of theirs is meant to be installed
endif()

set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME lib)  # everything not marked cuda or tools: the CPU package
set(ASC_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/ascender)
set(ASC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ascender)

# ---- the shared library: the static library's objects, whole-archive (compiled once for both) -----------------
set(ASC_EXPORTED_TARGETS ascender)
if(ASC_BUILD_SHARED)
  set_target_properties(ascender PROPERTIES POSITION_INDEPENDENT_CODE ON)
  add_library(ascender_shared SHARED ${PROJECT_SOURCE_DIR}/cmake/shared_library.cpp)
  add_library(ascender::ascender_shared ALIAS ascender_shared)
  set_target_properties(ascender_shared PROPERTIES OUTPUT_NAME ascender VERSION ${PROJECT_VERSION}
                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_link_libraries(ascender_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,ascender>")
  # What a consumer needs is what the static library asks for: its include directories, definitions and libraries.
  foreach(prop INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS INTERFACE_COMPILE_FEATURES
               INTERFACE_LINK_LIBRARIES)
    get_target_property(value ascender ${prop})
    if(value)
      set_target_properties(ascender_shared PROPERTIES ${prop} "${value}")
    endif()
  endforeach()
  list(APPEND ASC_EXPORTED_TARGETS ascender_shared)
endif()

# ---- the CUDA backend's libraries: static (whole-archive through ascender::cuda) and shared ------------------------
set(ASC_CUDA_EXPORTED_TARGETS)
if(TARGET ascender_cuda_static)
  set(ASC_CUDA_EXPORTED_TARGETS ascender_cuda_static ascender_cuda)
  if(ASC_BUILD_SHARED)
    add_library(ascender_cuda_shared SHARED ${PROJECT_SOURCE_DIR}/cmake/shared_library.cpp)
    add_library(ascender::cuda_shared ALIAS ascender_cuda_shared)
    set_target_properties(ascender_cuda_shared PROPERTIES OUTPUT_NAME ascender_cuda EXPORT_NAME cuda_shared
                          VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
    target_link_libraries(ascender_cuda_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,ascender_cuda_static>")
    target_link_libraries(ascender_cuda_shared PUBLIC ascender_shared)
    # Nothing a program calls is defined in it (it registers itself as it loads): without --no-as-needed, the
    # default of Debian's gcc, the linker would drop it.
    target_link_options(ascender_cuda_shared INTERFACE "LINKER:--no-as-needed")
    get_target_property(value ascender_cuda_static INTERFACE_COMPILE_DEFINITIONS)
    set_target_properties(ascender_cuda_shared PROPERTIES INTERFACE_COMPILE_DEFINITIONS "${value}")
    list(APPEND ASC_CUDA_EXPORTED_TARGETS ascender_cuda_shared)
  endif()
endif()

# ---- headers, libraries, the exported targets -------------------------------------------------------------------
# Public headers: every header of the library's folders except the kernels' own (ops/cpu/, and cuda/ but cuda.h).
install(FILES ${PROJECT_SOURCE_DIR}/ascender.h DESTINATION ${ASC_INSTALL_INCLUDEDIR})
# train/: the checkpoint, process-group and DDP headers (libascender); the trainer library's own headers stay out with
# it (built in the source tree only, train/CMakeLists.txt).
install(DIRECTORY core autograd ops nn optim models data stats train DESTINATION ${ASC_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.inc" PATTERN "cpu" EXCLUDE
        REGEX "train/(analyses|metrics|options|run|state|step|trainer)\\.h$" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/cuda/cuda.h DESTINATION ${ASC_INSTALL_INCLUDEDIR}/cuda)
install(TARGETS ${ASC_EXPORTED_TARGETS} EXPORT ascenderTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${ASC_INSTALL_INCLUDEDIR})
install(EXPORT ascenderTargets NAMESPACE ascender:: DESTINATION ${ASC_INSTALL_CMAKEDIR})
if(ASC_CUDA_EXPORTED_TARGETS)
  install(TARGETS ${ASC_CUDA_EXPORTED_TARGETS} EXPORT ascenderCudaTargets COMPONENT cuda
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT ascenderCudaTargets NAMESPACE ascender:: DESTINATION ${ASC_INSTALL_CMAKEDIR} COMPONENT cuda)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/README-cuda.md DESTINATION ${CMAKE_INSTALL_DOCDIR}-cuda
          RENAME README.md COMPONENT cuda)
endif()

# ---- what this build links: each dependency, once, for the descriptions of it below --------------------------------
# ASC_CONFIG_HAS_*: the config file's find_dependency()s; ASC_PC_*: pkg-config's flags; ASC_DEB_DEPENDS: the CPU
# package's Depends. The CUDA package declares only the CPU one: CUDA comes from NVIDIA's toolkit, not apt
# (cmake/README-cuda.md, installed with it, says what it needs).
get_target_property(ASC_PC_DEFINITIONS ascender INTERFACE_COMPILE_DEFINITIONS)
list(TRANSFORM ASC_PC_DEFINITIONS PREPEND "-D")
list(JOIN ASC_PC_DEFINITIONS " " ASC_PC_CFLAGS)
set(ASC_PC_LIBS_PRIVATE "-lpthread -lz")
set(ASC_DEB_DEPENDS "libfmt-dev, zlib1g-dev, libstdc++6")
set(ASC_CONFIG_HAS_OPENMP OFF)
set(ASC_CONFIG_HAS_MPI OFF)
set(ASC_CONFIG_HAS_DNNL OFF)
if(OpenMP_CXX_FOUND)
  set(ASC_CONFIG_HAS_OPENMP ON)
  string(APPEND ASC_PC_CFLAGS " ${OpenMP_CXX_FLAGS}")
  string(APPEND ASC_PC_LIBS_PRIVATE " ${OpenMP_CXX_FLAGS}")
  string(APPEND ASC_DEB_DEPENDS ", libgomp1")
endif()
if(ASC_HAVE_OPENBLAS)
  string(APPEND ASC_PC_LIBS_PRIVATE " -lopenblas")
  string(APPEND ASC_DEB_DEPENDS ", libopenblas-dev")
endif()
if(ASC_HAVE_DNNL)
  set(ASC_CONFIG_HAS_DNNL ON)
  string(APPEND ASC_PC_LIBS_PRIVATE " -ldnnl")
  string(APPEND ASC_DEB_DEPENDS ", libdnnl-dev, ocl-icd-opencl-dev")
endif()
if(MPI_CXX_FOUND)
  set(ASC_CONFIG_HAS_MPI ON)
  list(JOIN MPI_CXX_LIBRARIES " " ASC_PC_MPI_LIBS)
  string(APPEND ASC_PC_LIBS_PRIVATE " ${ASC_PC_MPI_LIBS}")
  string(APPEND ASC_DEB_DEPENDS ", libopenmpi-dev")
endif()
set(ASC_PC_CUDA_LIBS_PRIVATE "")
if(TARGET ascender_cuda_static)
  set(ASC_PC_CUDA_LIBS_PRIVATE "-L${CUDAToolkit_LIBRARY_DIR} -lcudart -lcublas")
  if(ASC_CUDNN_LIBRARY)
    string(APPEND ASC_PC_CUDA_LIBS_PRIVATE " ${ASC_CUDNN_LIBRARY}")
  endif()
  if(ASC_HAVE_NCCL)
    string(APPEND ASC_PC_CUDA_LIBS_PRIVATE " ${ASC_NCCL_LIBRARY}")
  endif()
endif()

# ---- the CMake package: config (finds the dependencies again), version ------------------------------------------
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ascenderConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ascenderConfig.cmake INSTALL_DESTINATION ${ASC_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same major.minor is compatible (from 1.0: SameMajorVersion).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ascenderConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ascenderConfig.cmake ${PROJECT_BINARY_DIR}/ascenderConfigVersion.cmake
        DESTINATION ${ASC_INSTALL_CMAKEDIR})

# ---- pkg-config (the shared libraries; --static adds what the static ones need) ---------------------------------
file(RELATIVE_PATH ASC_PC_INCLUDE_FROM_PCDIR /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p/${ASC_INSTALL_INCLUDEDIR})
configure_file(${PROJECT_SOURCE_DIR}/cmake/ascender.pc.in ${PROJECT_BINARY_DIR}/ascender.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ascender.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(TARGET ascender_cuda_static)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ascender-cuda.pc.in ${PROJECT_BINARY_DIR}/ascender-cuda.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/ascender-cuda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT cuda)
endif()

# ---- CPack: Debian packages of the same install, one per component ---------------------------------------------------
set(CPACK_PACKAGE_VENDOR "ascender")
set(CPACK_PACKAGE_CONTACT "ascender developers <ascender@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_COMPONENTS_ALL lib)
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libascender-dev)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_LIB_PACKAGE_DEPENDS "${ASC_DEB_DEPENDS}")
set(CPACK_COMPONENT_LIB_DESCRIPTION
    "ascender deep-learning framework: headers, static and shared library (CPU backend), CMake package")
set(ASC_TOOLS_NEED libascender-dev)
if(TARGET ascender_cuda_static)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
  set(CPACK_DEBIAN_CUDA_PACKAGE_NAME libascender-cuda-dev)
  set(CPACK_DEBIAN_CUDA_PACKAGE_SECTION libdevel)
  set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "libascender-dev (= ${PROJECT_VERSION})")
  set(CPACK_COMPONENT_CUDA_DESCRIPTION
      "ascender deep-learning framework: the CUDA backend (needs NVIDIA's CUDA toolkit, see its README.md)")
  set(ASC_TOOLS_NEED libascender-cuda-dev)
endif()
if(ASC_BUILD_TOOLS)
  list(APPEND CPACK_COMPONENTS_ALL tools)
  set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME ascender-tools)
  set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
  # The tools link the libraries statically; what they load at run time is what the libraries' packages bring.
  set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "${ASC_TOOLS_NEED} (= ${PROJECT_VERSION})")
  set(CPACK_COMPONENT_TOOLS_DESCRIPTION "ascender deep-learning framework: the command-line tools (train, demo, benchmarks)")
endif()
include(CPack)
