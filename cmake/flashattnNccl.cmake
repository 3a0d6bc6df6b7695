# Finds NCCL for flashattn::dist and defines the imported target flashattn::nccl: nccl.h and
# libnccl looked for in NCCL_ROOT, then beside the CUDA toolkit (the CUDA 13 toolkit ships NCCL
# in its include/ and lib/), then in the system's folders. Sets FLASHATTN_NCCL_FOUND. Used by the
# build (CMakeLists.txt) and by the installed package (flashattnConfig.cmake), so a consumer of a
# static libflashattn links the NCCL of its own machine.
find_package(CUDAToolkit REQUIRED)
set(_nccl_hints $ENV{NCCL_ROOT} ${NCCL_ROOT} "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")
find_path(FLASHATTN_NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(FLASHATTN_NCCL_LIBRARY NAMES nccl
  HINTS ${_nccl_hints} "${CUDAToolkit_LIBRARY_DIR}" PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
set(FLASHATTN_NCCL_FOUND OFF)
if(FLASHATTN_NCCL_INCLUDE_DIR AND FLASHATTN_NCCL_LIBRARY)
  set(FLASHATTN_NCCL_FOUND ON)
  if(NOT TARGET flashattn::nccl)
    add_library(flashattn::nccl UNKNOWN IMPORTED GLOBAL)
    set_target_properties(flashattn::nccl PROPERTIES
      IMPORTED_LOCATION "${FLASHATTN_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${FLASHATTN_NCCL_INCLUDE_DIR}")
  endif()
  message(STATUS "flashattn: NCCL ${FLASHATTN_NCCL_LIBRARY}")
endif()
