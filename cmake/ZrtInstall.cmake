# zrt as a library: the umbrella target zrt::zrt (in the build tree for add_subdirectory, and
# exported), the generated <zrt/version.h>, and the install rules with the package config that
# find_package(zrt) reads:
#   <prefix>/bin                       zrt-train, zrt-ckpt, zrt-mem, zrt-data, zrt-bench, zrt-run
#   <prefix>/lib                       the static libraries
#   <prefix>/include/zrt/*.h           the public headers (include/zrt in the sources)
#   <prefix>/include/zrt/detail/...    the headers those include, at their source paths
#   <prefix>/lib/cmake/zrt             zrtConfig.cmake, zrtConfigVersion.cmake, zrtTargets*.cmake

# Every zrt library, the training loop (train/) included.
add_library(zrt INTERFACE)
target_link_libraries(zrt INTERFACE zrt_runtime zrt_data zrt_optimizers zrt_engine zrt_offload zrt_config
                      zrt_checkpoint zrt_kernels zrt_models zrt_train)
add_library(zrt::zrt ALIAS zrt)

configure_file(${CMAKE_CURRENT_LIST_DIR}/version.h.in ${PROJECT_BINARY_DIR}/include/zrt/version.h
               @ONLY)

# The CUDA stand-in build links the backend against a test library that is not installed.
if(NOT ZRT_INSTALL OR ZRT_CUDA_STANDIN)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(ZRT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zrt)

set(zrt_exported_targets zrt zrt_usage zrt_runtime zrt_data zrt_optimizers zrt_engine zrt_offload zrt_config
    zrt_checkpoint zrt_kernels zrt_models zrt_train)
if(ZRT_HAVE_CUDA)
  list(APPEND zrt_exported_targets zrt_cudart zrt_cublas zrt_nccl)
endif()
if(ZRT_HAVE_CUDNN_ATTENTION)
  list(APPEND zrt_exported_targets zrt_cudnn)
endif()
install(TARGETS ${zrt_exported_targets} EXPORT zrtTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS zrt-train zrt-ckpt zrt-mem zrt-data zrt-bench
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# zrt-run looks for zrt-train next to itself.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/zrt-run DESTINATION ${CMAKE_INSTALL_BINDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zrt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/zrt/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zrt)
# The public headers forward to the sources' headers, which include each other by their path
# from the source root: all of them are installed, at those paths, so whatever a public header
# reaches is there.
foreach(dir runtime config offload kernels models optimizers train tools/mem)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zrt/detail/${dir}
          FILES_MATCHING PATTERN "*.h")
endforeach()

install(EXPORT zrtTargets NAMESPACE zrt:: DESTINATION ${ZRT_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/zrtConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zrtConfig.cmake
                              INSTALL_DESTINATION ${ZRT_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zrtConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zrtConfig.cmake ${PROJECT_BINARY_DIR}/zrtConfigVersion.cmake
        DESTINATION ${ZRT_INSTALL_CMAKEDIR})
