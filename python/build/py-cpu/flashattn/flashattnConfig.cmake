# flashattn's CMake package: find_package(flashattn CONFIG REQUIRED), then link
# flashattn::flashattn. Written by CMakeLists.txt at install time (docs/cpp.md).

####### Expanded from @PACKAGE_INIT@ by configure_package_config_file() #######
####### Any changes to this file will be overwritten by the next CMake run ####
####### The input file was flashattnConfig.cmake.in                            ########

get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/../../../../" ABSOLUTE)

macro(set_and_check _var _file)
  set(${_var} "${_file}")
  if(NOT EXISTS "${_file}")
    message(FATAL_ERROR "File or directory ${_file} referenced by variable ${_var} does not exist !")
  endif()
endmacro()

macro(check_required_components _NAME)
  foreach(comp ${${_NAME}_FIND_COMPONENTS})
    if(NOT ${_NAME}_${comp}_FOUND)
      if(${_NAME}_FIND_REQUIRED_${comp})
        set(${_NAME}_FOUND FALSE)
      endif()
    endif()
  endforeach()
endmacro()

####################################################################################

# Whether this build has the CUDA backend (CPU tensors always run on the CPU backend).
set(flashattn_WITH_CUDA OFF)

include(CMakeFindDependencyMacro)
set(_flashattn_static ON)
if(_flashattn_static)
  # A static library: its own dependencies come into the consumer's link.
  find_dependency(Threads)
  find_dependency(OpenMP COMPONENTS CXX)
endif()
if(flashattn_WITH_CUDA)
  # The kernels call the CUDA runtime (CUDA::cudart), from the toolkit of this major version on.
  find_dependency(CUDAToolkit )
endif()

include("${CMAKE_CURRENT_LIST_DIR}/flashattnTargets.cmake")
unset(_flashattn_static)
check_required_components(flashattn)
