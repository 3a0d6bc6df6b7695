#----------------------------------------------------------------
# Generated CMake target import file for configuration "Release".
#----------------------------------------------------------------

# Commands may need to know the format version.
set(CMAKE_IMPORT_FILE_VERSION 1)

# Import target "flashattn::flashattn" for configuration "Release"
set_property(TARGET flashattn::flashattn APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(flashattn::flashattn PROPERTIES
  IMPORTED_LINK_INTERFACE_LANGUAGES_RELEASE "CXX"
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/flashattn/lib/libflashattn.a"
  )

list(APPEND _cmake_import_check_targets flashattn::flashattn )
list(APPEND _cmake_import_check_files_for_flashattn::flashattn "${_IMPORT_PREFIX}/flashattn/lib/libflashattn.a" )

# Commands beyond this point should not need to know the version.
set(CMAKE_IMPORT_FILE_VERSION)
