# Decides whether the CUDA backend is built and, if so, finds the toolkit, cuBLAS and NCCL.
# Sets ZRT_HAVE_CUDA and the targets zrt::cudart, zrt::cublas (cuBLAS + cuBLASLt) and zrt::nccl.
#
# ZRT_CUDA_STANDIN=ON (tests only) builds the CUDA backend with nvcc as usual but links it
# against tests/standin/'s CPU stand-ins for the CUDA runtime, cuBLAS(Lt) and NCCL instead of the
# real libraries, so the backend's host code runs on machines without a GPU.
option(ZRT_CUDA_STANDIN "Link the CUDA backend against the CPU stand-ins in tests/standin" OFF)
set(ZRT_HAVE_CUDA OFF)
if(ZRT_CUDA_STANDIN)
  if(ZRT_CUDA STREQUAL "OFF")
    message(FATAL_ERROR "ZRT_CUDA_STANDIN=ON needs the CUDA backend (ZRT_CUDA AUTO or ON)")
  endif()
  set(ZRT_CUDA ON)
  # nvcc links cudart statically by default; the stand-in must provide every runtime symbol.
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
endif()
if(ZRT_CUDA STREQUAL "OFF")
  return()
endif()
if(NOT ZRT_CUDA MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "ZRT_CUDA must be AUTO, ON or OFF, not '${ZRT_CUDA}'")
endif()

# nvcc is often installed off PATH; look in the usual place before giving up.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  find_program(_zrt_nvcc nvcc)
  if(NOT _zrt_nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(ZRT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZRT_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
  message(STATUS "zrt: nvcc not found; building the CPU backend only")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include)
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "CUDA found but NCCL is missing (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: ${NCCL_LIBRARY})")
endif()
add_library(zrt_cudart INTERFACE)
add_library(zrt_cublas INTERFACE)
add_library(zrt_nccl INTERFACE)
target_include_directories(zrt_nccl INTERFACE ${NCCL_INCLUDE_DIR})
if(ZRT_CUDA_STANDIN)
  # zrt_cuda_standin (tests/standin) implements the runtime, cuBLAS(Lt) and NCCL subsets.
  target_link_libraries(zrt_cudart INTERFACE CUDA::toolkit zrt_cuda_standin)
  target_link_libraries(zrt_cublas INTERFACE CUDA::toolkit zrt_cuda_standin)
  target_link_libraries(zrt_nccl INTERFACE zrt_cuda_standin)
else()
  target_link_libraries(zrt_cudart INTERFACE CUDA::cudart)
  target_link_libraries(zrt_cublas INTERFACE CUDA::cublas CUDA::cublasLt)
  target_link_libraries(zrt_nccl INTERFACE ${NCCL_LIBRARY})
endif()
add_library(zrt::cudart ALIAS zrt_cudart)
add_library(zrt::cublas ALIAS zrt_cublas)
add_library(zrt::nccl ALIAS zrt_nccl)
set(ZRT_HAVE_CUDA ON)

# cuDNN's fused attention (kernels/cuda/cudnn_attention.cc, ZRT_CUDA_ATTENTION=cudnn) is built
# through NVIDIA's header-only cuDNN frontend when its headers (tools/install-cudnn-frontend, or
# ZRT_CUDNN_FRONTEND_ROOT) and the toolkit's cuDNN are found; never against the stand-ins (they
# have no cuDNN). ZRT_CUDNN_ATTENTION_ABSENT carries the reason into the build when it is not.
option(ZRT_CUDNN_ATTENTION "Build cuDNN's fused attention when the cuDNN frontend is found" ON)
set(ZRT_HAVE_CUDNN_ATTENTION OFF)
set(ZRT_CUDNN_ATTENTION_ABSENT "")
if(ZRT_CUDA_STANDIN)
  set(ZRT_CUDNN_ATTENTION_ABSENT "a build against the CUDA stand-ins has no cuDNN")
elseif(NOT ZRT_CUDNN_ATTENTION)
  set(ZRT_CUDNN_ATTENTION_ABSENT "this build was configured with -DZRT_CUDNN_ATTENTION=OFF")
else()
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS "$ENV{ZRT_CUDNN_FRONTEND_ROOT}/include"
                  "$ENV{HOME}/.cache/zrt/cudnn-frontend-1.32.0/include"
            NO_DEFAULT_PATH)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
    set(ZRT_CUDNN_ATTENTION_ABSENT
        "this build has no cuDNN attention: the cuDNN frontend's headers were not found when it was configured (run tools/install-cudnn-frontend, then configure and build again)")
  elseif(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    set(ZRT_CUDNN_ATTENTION_ABSENT
        "this build has no cuDNN attention: the CUDA toolkit's cuDNN (cudnn.h, libcudnn) was not found when it was configured")
  else()
    add_library(zrt_cudnn INTERFACE)
    # NVRTC: the frontend compiles some engines at run time (it links, whether used or not).
    target_link_libraries(zrt_cudnn INTERFACE ${CUDNN_LIBRARY} CUDA::nvrtc)
    add_library(zrt::cudnn ALIAS zrt_cudnn)
    set(ZRT_HAVE_CUDNN_ATTENTION ON)
  endif()
endif()
if(ZRT_HAVE_CUDNN_ATTENTION)
  message(STATUS "zrt: cuDNN attention on (frontend ${CUDNN_FRONTEND_INCLUDE_DIR}, ${CUDNN_LIBRARY})")
else()
  message(STATUS "zrt: cuDNN attention off: ${ZRT_CUDNN_ATTENTION_ABSENT}")
endif()
message(STATUS "zrt: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${NCCL_LIBRARY}, stand-ins ${ZRT_CUDA_STANDIN}")
