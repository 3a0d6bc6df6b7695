# Which GPU kernels a build compiles when the user names none: the kernel families
# (FLASHATTN_KERNEL_FAMILIES) and the architectures of the sm80 family (FLASHATTN_SM80_ARCHS),
# chosen for the GPUs of the building machine. python/CMakeLists.txt uses it, so that
# `pip install ./python` compiles for the machine's GPUs rather than for every one;
# python/tests/test_cuda_targets.py checks it.
#
#   flashattn_select_cuda_targets(<request> <families_var> <sm80_archs_var>)
#     <request>: "all", or a list of compute capabilities ("86", "8.6", "sm_86", "86-real").
#     all: every family, the sm80 family for 80-real (which runs on every 8.x GPU) and 90-real.
#     A list: the sm80 family for each 8.x or 9.0 capability listed, the sm90 family where 9.0
#     is listed; other capabilities have no kernels and are left out (each named in
#     FLASHATTN_CUDA_TARGETS_IGNORED). Sets both variables empty when none is left.
#   flashattn_detect_gpus(<var>)
#     The compute capabilities of the visible GPUs ("86;90"), empty without driver or GPU.
#   flashattn_default_cuda_targets()
#     The whole decision, for a project that has not yet add_subdirectory'd the library:
#     the request is the cache variable FLASHATTN_CUDA_ARCHS unless it is "auto" (the default),
#     else the environment variable FLASHATTN_CUDA_ARCHS, else the detected GPUs (all when no
#     GPU with kernels is visible). FLASHATTN_KERNEL_FAMILIES and FLASHATTN_SM80_ARCHS are set
#     in the cache from it, except where the user set them: a value this function did not write
#     is kept.

include_guard(GLOBAL)
set(_flashattn_cuda_targets_dir "${CMAKE_CURRENT_LIST_DIR}")

function(flashattn_select_cuda_targets request families_var sm80_archs_var)
  if(request STREQUAL "all")
    set(${families_var} "sm80;sm90" PARENT_SCOPE)
    set(${sm80_archs_var} "80-real;90-real" PARENT_SCOPE)
    set(FLASHATTN_CUDA_TARGETS_IGNORED "" PARENT_SCOPE)
    return()
  endif()
  set(_caps "")
  set(_ignored "")
  foreach(_item IN LISTS request)
    string(STRIP "${_item}" _item)
    if(_item STREQUAL "")
      continue()
    endif()
    if(NOT _item MATCHES "^(sm_?)?([0-9]+)\\.?([0-9])?(-real)?$")
      message(FATAL_ERROR "flashattn: '${_item}' is not a compute capability "
                          "(write 86, 8.6 or sm_86; or all)")
    endif()
    if(CMAKE_MATCH_3 STREQUAL "")
      set(_cap "${CMAKE_MATCH_2}")  # 86
    else()
      set(_cap "${CMAKE_MATCH_2}${CMAKE_MATCH_3}")  # 8.6
    endif()
    if((_cap GREATER_EQUAL 80 AND _cap LESS 90) OR _cap EQUAL 90)
      list(APPEND _caps ${_cap})
    else()
      list(APPEND _ignored ${_cap})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _caps)
  list(REMOVE_DUPLICATES _ignored)
  list(SORT _caps COMPARE NATURAL)
  set(_families "")
  set(_archs "")
  if(_caps)
    # The sm80 family serves every GPU, Hopper included (head dim 32, decoding, fallback).
    set(_families sm80)
    list(FIND _caps 90 _hopper)  # (not IN_LIST: the module also runs under cmake -P, policy-free)
    if(_hopper GREATER_EQUAL 0)
      list(APPEND _families sm90)
    endif()
    list(TRANSFORM _caps APPEND "-real" OUTPUT_VARIABLE _archs)
  endif()
  set(${families_var} "${_families}" PARENT_SCOPE)
  set(${sm80_archs_var} "${_archs}" PARENT_SCOPE)
  set(FLASHATTN_CUDA_TARGETS_IGNORED "${_ignored}" PARENT_SCOPE)
endfunction()

function(flashattn_detect_gpus out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(NOT CMAKE_HOST_UNIX OR NOT CMAKE_CXX_COMPILER_LOADED)
    return()
  endif()
  # Built once per build folder; run at every configure.
  set(_dir "${CMAKE_BINARY_DIR}/CMakeFiles/flashattn_gpu_query")
  set(_exe "${_dir}/flashattn_gpu_query")
  if(NOT EXISTS "${_exe}")
    try_compile(_flashattn_gpu_query_built "${_dir}/build"
      SOURCES "${_flashattn_cuda_targets_dir}/flashattn_gpu_query.cpp"
      LINK_LIBRARIES ${CMAKE_DL_LIBS}
      COPY_FILE "${_exe}"
      OUTPUT_VARIABLE _log)
    unset(_flashattn_gpu_query_built CACHE)
    if(NOT EXISTS "${_exe}")
      message(WARNING "flashattn: the GPU query program did not build; assuming no GPU\n${_log}")
      return()
    endif()
  endif()
  execute_process(COMMAND "${_exe}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _caps
                  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
  if(_rc EQUAL 0 AND _caps MATCHES "^[0-9;]+$")
    set(${out_var} "${_caps}" PARENT_SCOPE)
  endif()
endfunction()

function(flashattn_default_cuda_targets)
  set(FLASHATTN_CUDA_ARCHS "auto" CACHE STRING
      "GPUs to build kernels for: auto (the environment variable FLASHATTN_CUDA_ARCHS, else this machine's GPUs, else all), all, or compute capabilities such as 86;90")
  set(_request "$CACHE{FLASHATTN_CUDA_ARCHS}")
  set(_source "FLASHATTN_CUDA_ARCHS=${_request}")
  if(_request STREQUAL "" OR _request STREQUAL "auto")
    if(NOT "$ENV{FLASHATTN_CUDA_ARCHS}" STREQUAL "" AND NOT "$ENV{FLASHATTN_CUDA_ARCHS}" STREQUAL "auto")
      set(_request "$ENV{FLASHATTN_CUDA_ARCHS}")
      set(_source "environment FLASHATTN_CUDA_ARCHS=${_request}")
    else()
      flashattn_detect_gpus(_detected)
      if(_detected)
        set(_request "${_detected}")
        set(_source "GPUs of this machine: ${_detected}")
      else()
        set(_request all)
        set(_source "no GPU visible: all")
      endif()
    endif()
  endif()
  flashattn_select_cuda_targets("${_request}" _families _archs)
  if(FLASHATTN_CUDA_TARGETS_IGNORED)
    message(WARNING "flashattn: no kernels for compute capability ${FLASHATTN_CUDA_TARGETS_IGNORED} "
                    "(they need 8.x or 9.0); left out (${_source})")
  endif()
  if(NOT _families)
    if(_source MATCHES "^GPUs of this machine")
      flashattn_select_cuda_targets(all _families _archs)
      string(APPEND _source ", none with kernels: all")
    else()
      message(FATAL_ERROR "flashattn: ${_source} names no GPU that has kernels (8.x or 9.0)")
    endif()
  endif()

  set(_doc_FLASHATTN_KERNEL_FAMILIES "GPU kernel families to build")
  set(_doc_FLASHATTN_SM80_ARCHS "CUDA architectures the sm80 family is compiled for")
  set(_value_FLASHATTN_KERNEL_FAMILIES "${_families}")
  set(_value_FLASHATTN_SM80_ARCHS "${_archs}")
  set(_summary "")
  foreach(_var FLASHATTN_KERNEL_FAMILIES FLASHATTN_SM80_ARCHS)
    # Ours to set: not in the cache yet, or holding what this function wrote last time.
    if(NOT DEFINED CACHE{${_var}} OR
       (DEFINED CACHE{_FLASHATTN_DERIVED_${_var}} AND
        "$CACHE{${_var}}" STREQUAL "$CACHE{_FLASHATTN_DERIVED_${_var}}"))
      set(${_var} "${_value_${_var}}" CACHE STRING "${_doc_${_var}}" FORCE)
      set(_FLASHATTN_DERIVED_${_var} "${_value_${_var}}" CACHE INTERNAL "")
      string(APPEND _summary " ${_var}=${_value_${_var}}")
    else()
      string(APPEND _summary " ${_var}=$CACHE{${_var}} (set by the user)")
    endif()
  endforeach()
  message(STATUS "flashattn: GPU targets from ${_source}:${_summary}")
endfunction()
