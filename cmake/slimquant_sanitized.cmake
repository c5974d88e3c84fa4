# The sanitized test run (scripts/check-sanitizers.sh, SLIMQUANT_SANITIZED_TESTS=ON): AddressSanitizer
# and UndefinedBehaviorSanitizer where memory errors can hide, without a second full build.
#
# Only the code that reads untrusted bytes (model, tensor, image-list and YAML parsers, the data
# sets) and the code that computes its own indices (the kernels that are not a thin call into
# oneDNN, the session's memory plan) is compiled again, instrumented. Everything else,
# tests included, is the normal build's own objects, linked against the sanitizer runtimes: ASan
# then checks every access the instrumented code makes, whoever allocated the memory, and LeakSanitizer
# sees every allocation of the process. A full instrumented build took about 25 minutes on 2 cores
# and mostly re-checked oneDNN calls and the quantization flow's std containers.
#
# Defines slimquant_sanitized (the library with the instrumented objects swapped in), and
# slimquant_sanitized_link(<target>) for executables linked against it.

set(SLIMQUANT_SANITIZE_COMPILE_FLAGS
    -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
    # -O0: exact stack traces, and the instrumented kernels compile 4x faster than at -O1 (the
    # elementwise binary ops: 49 s against 185 s on 2 cores, the longest file of the run); the
    # tests that run them use small tensors. assert() stays live (the Release flags define NDEBUG).
    # One code path per function: target_clones would compile the same source lines again per clone.
    -O0 -g -UNDEBUG -DSLIMQUANT_NO_CPU_CLONES)
set(SLIMQUANT_SANITIZE_LINK_FLAGS -fsanitize=address,undefined)

# What is instrumented: SLIMQUANT_SANITIZED_SOURCE_GLOBS (cmake/slimquant_layers.cmake).
set(_sanitized_objects)
foreach(layer_target IN LISTS SLIMQUANT_LAYER_TARGETS)
  string(REGEX REPLACE "^slimquant_" "" layer ${layer_target})
  slimquant_sanitized_sources(${layer} picked)
  if(NOT picked)
    list(APPEND _sanitized_objects $<TARGET_OBJECTS:${layer_target}>)
    continue()
  endif()
  # The instrumented copies, compiled exactly as files of their layer (its include views).
  add_library(${layer_target}_sanitized OBJECT ${picked})
  _slimquant_as_layer(${layer_target}_sanitized ${layer})
  target_compile_options(${layer_target}_sanitized PRIVATE ${SLIMQUANT_SANITIZE_COMPILE_FLAGS})
  get_target_property(layer_headers ${layer_target} SLIMQUANT_PRECOMPILED_HEADERS)
  target_precompile_headers(${layer_target}_sanitized PRIVATE ${layer_headers})
  set_target_properties(${layer_target}_sanitized PROPERTIES POSITION_INDEPENDENT_CODE ON)
  get_target_property(unity ${layer_target} UNITY_BUILD)
  if(unity)  # the same batches as the normal objects it replaces
    set_target_properties(${layer_target}_sanitized PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  endif()
  get_target_property(layer_definitions ${layer_target} COMPILE_DEFINITIONS)
  if(layer_definitions)
    target_compile_definitions(${layer_target}_sanitized PRIVATE ${layer_definitions})
  endif()
  list(APPEND _sanitized_objects $<TARGET_OBJECTS:${layer_target}_sanitized>)
  # ... and the layer's other objects, as the normal build compiled them.
  set(exclude_regex)
  foreach(source IN LISTS picked)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${source})
    string(REGEX REPLACE "([.+])" "\\\\\\1" rel_regex "${rel}")
    list(APPEND exclude_regex "/${rel_regex}\\.o$")
  endforeach()
  # In a unity build, the batches of the sanitized list (cmake/slimquant_layers.cmake).
  list(APPEND exclude_regex "/Unity/unity_${layer}_sanitized_[0-9]+_cxx\\.cxx\\.o$")
  list(JOIN exclude_regex "|" exclude_regex)
  list(APPEND _sanitized_objects "$<FILTER:$<TARGET_OBJECTS:${layer_target}>,EXCLUDE,${exclude_regex}>")
endforeach()

add_library(slimquant_sanitized STATIC ${_sanitized_objects})
set_target_properties(slimquant_sanitized PROPERTIES LINKER_LANGUAGE CXX)
target_include_directories(slimquant_sanitized PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_link_libraries(slimquant_sanitized PUBLIC ${SLIMQUANT_PUBLIC_LIBRARIES} PRIVATE ${SLIMQUANT_PRIVATE_LIBRARIES})
if(SLIMQUANT_BUILD_MPI)
  target_link_libraries(slimquant_sanitized PRIVATE MPI::MPI_CXX)
endif()

# An executable linked against the sanitized library and the sanitizer runtimes.
function(slimquant_sanitized_link target)
  target_link_options(${target} PRIVATE ${SLIMQUANT_SANITIZE_LINK_FLAGS})
endfunction()
