# Installing ascender for other projects: `cmake --install build/release --prefix <dir>` puts
#   include/ascender/...                   the public headers, laid out as in the source tree ("core/tensor.h", "ascender.h")
#   lib/libascender.a, lib/libascender.so  the library, static and shared (the same objects, compiled position-independent)
#   lib/cmake/ascender/                    the CMake package: find_package(ascender CONFIG REQUIRED), then link
#                                          ascender::ascender (static) or ascender::ascender_shared
#   lib/pkgconfig/ascender.pc              for builds without CMake: pkg-config --cflags --libs ascender
# and `cpack -G DEB` (in the build directory) packs the same as a Debian package. examples/ is a project of its own
# built against such an install (tools/check_package.sh, run by the test command).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(ASC_BUILD_SHARED "Also build the shared library libascender.so" ON)
if(ASC_CUDA_EMULATION OR ASC_SANITIZE OR ASC_SANITIZE_THREAD)
  return()  # test builds: nothing of theirs is meant to be installed
endif()

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
  foreach(prop INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS INTERFACE_LINK_LIBRARIES)
    get_target_property(value ascender ${prop})
    if(value)
      set_target_properties(ascender_shared PROPERTIES ${prop} "${value}")
    endif()
  endforeach()
  list(APPEND ASC_EXPORTED_TARGETS ascender_shared)
endif()

# ---- headers, libraries, the exported targets -------------------------------------------------------------------
# Public headers: every header of the library's folders except the kernels' own (ops/cpu/, and cuda/ but cuda.h).
install(FILES ${PROJECT_SOURCE_DIR}/ascender.h DESTINATION ${ASC_INSTALL_INCLUDEDIR})
install(DIRECTORY core autograd ops nn optim models data stats DESTINATION ${ASC_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.inc" PATTERN "cpu" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/cuda/cuda.h DESTINATION ${ASC_INSTALL_INCLUDEDIR}/cuda)
install(TARGETS ${ASC_EXPORTED_TARGETS} EXPORT ascenderTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${ASC_INSTALL_INCLUDEDIR})
install(EXPORT ascenderTargets NAMESPACE ascender:: DESTINATION ${ASC_INSTALL_CMAKEDIR})

# ---- what this build links: each dependency, once, for the three descriptions of it below --------------------------
# ASC_CONFIG_HAS_*: the config file's find_dependency()s; ASC_PC_*: pkg-config's flags; ASC_DEB_DEPENDS: the .deb's
# Depends (CUDA comes from NVIDIA's toolkit, not apt).
get_target_property(ASC_PC_DEFINITIONS ascender INTERFACE_COMPILE_DEFINITIONS)
list(TRANSFORM ASC_PC_DEFINITIONS PREPEND "-D")
list(JOIN ASC_PC_DEFINITIONS " " ASC_PC_CFLAGS)
set(ASC_PC_LIBS_PRIVATE "-lpthread -lz")
set(ASC_DEB_DEPENDS "libfmt-dev, zlib1g-dev, libstdc++6")
set(ASC_CONFIG_HAS_OPENMP OFF)
set(ASC_CONFIG_HAS_MPI OFF)
set(ASC_CONFIG_HAS_CUDA ${ASC_HAVE_CUDA})
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
if(MPI_CXX_FOUND)
  set(ASC_CONFIG_HAS_MPI ON)
  list(JOIN MPI_CXX_LIBRARIES " " ASC_PC_MPI_LIBS)
  string(APPEND ASC_PC_LIBS_PRIVATE " ${ASC_PC_MPI_LIBS}")
  string(APPEND ASC_DEB_DEPENDS ", libopenmpi-dev")
endif()
if(ASC_HAVE_CUDA)
  string(APPEND ASC_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lcublas")
  if(ASC_CUDNN_LIBRARY)
    string(APPEND ASC_PC_LIBS_PRIVATE " ${ASC_CUDNN_LIBRARY}")
  endif()
  if(ASC_HAVE_NCCL)
    string(APPEND ASC_PC_LIBS_PRIVATE " ${ASC_NCCL_LIBRARY}")
  endif()
endif()

# ---- the CMake package: config (finds the dependencies again), version ------------------------------------------
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ascenderConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ascenderConfig.cmake INSTALL_DESTINATION ${ASC_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same major.minor is compatible (from 1.0: SameMajorVersion).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ascenderConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ascenderConfig.cmake ${PROJECT_BINARY_DIR}/ascenderConfigVersion.cmake
        DESTINATION ${ASC_INSTALL_CMAKEDIR})

# ---- pkg-config (the shared library; --static adds what the static one needs) -----------------------------------
file(RELATIVE_PATH ASC_PC_INCLUDE_FROM_PCDIR /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p/${ASC_INSTALL_INCLUDEDIR})
configure_file(${PROJECT_SOURCE_DIR}/cmake/ascender.pc.in ${PROJECT_BINARY_DIR}/ascender.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ascender.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- CPack: a Debian package of the same install ------------------------------------------------------------------
set(CPACK_PACKAGE_NAME libascender-dev)
set(CPACK_PACKAGE_VENDOR "ascender")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "ascender deep-learning framework: headers, static and shared library, CMake package")
set(CPACK_PACKAGE_CONTACT "ascender developers <ascender@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${ASC_DEB_DEPENDS}")
set(CPACK_GENERATOR DEB)
include(CPack)
