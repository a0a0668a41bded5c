# dcp_add_part(<part> SOURCES ... [HEADERS ...] [DEPS ...] [PRIVATE_DEPS ...])
#
# One static library per part of the pipeline, `dcp_<part>` (alias dcp::<part>). DEPS are the
# parts (by name) and libraries it may use in its public headers; a part links only the parts
# below it in docs/architecture.md. HEADERS are the headers under include/dcp/ that the part
# owns: the layering test (tests/arch) reads every part's record and fails on an include of a
# header owned by a part that is not among its transitive DEPS.
set(DCP_PARTS "" CACHE INTERNAL "parts in declaration order")
function(dcp_add_part part)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target dcp_${part})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(dcp::${part} ALIAS ${target})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:include>
                                       PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DCP_WARNINGS}>)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME ${part})
  if(DCP_ENABLE_HEAVY_ASSERTS)
    target_compile_definitions(${target} PUBLIC DCP_HEAVY_ASSERTS)
  endif()
  set(part_deps "")
  foreach(dep ${ARG_DEPS})
    if(TARGET dcp_${dep})
      target_link_libraries(${target} PUBLIC dcp_${dep})
      list(APPEND part_deps ${dep})
    else()
      target_link_libraries(${target} PUBLIC ${dep})
    endif()
  endforeach()
  foreach(dep ${ARG_PRIVATE_DEPS})
    if(TARGET dcp_${dep})
      target_link_libraries(${target} PRIVATE dcp_${dep})
      list(APPEND part_deps ${dep})
    else()
      target_link_libraries(${target} PRIVATE ${dep})
    endif()
  endforeach()
  # The record the layering test reads: part, its source folder, its part deps, its headers.
  set(sources "")
  foreach(s ${ARG_SOURCES})
    get_filename_component(abs ${s} ABSOLUTE)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
    list(APPEND sources ${rel})
  endforeach()
  file(RELATIVE_PATH dir ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  list(JOIN sources "\",\"" sources)
  list(JOIN part_deps "\",\"" part_deps)
  list(JOIN ARG_HEADERS "\",\"" headers)
  set_property(GLOBAL APPEND_STRING PROPERTY DCP_PART_RECORDS
               "{\"part\":\"${part}\",\"dir\":\"${dir}\",\"sources\":[\"${sources}\"],\"deps\":[\"${part_deps}\"],\"headers\":[\"${headers}\"]}\n")
  set_property(GLOBAL APPEND PROPERTY DCP_PART_TARGETS ${target})
endfunction()

# Writes every part's record as JSON lines to <file> (after all parts are declared).
function(dcp_write_part_records file)
  get_property(records GLOBAL PROPERTY DCP_PART_RECORDS)
  file(WRITE ${file} "${records}")
endfunction()
