# Enforced layering (docs/ARCHITECTURE.md, "Layers"): one OBJECT library per folder of src/, combined
# into the one static library `slimquant` that users link.
#
# A compiler sees a header only through an include directory, so each layer gets "views": folders
# under <build>/layer_views/ made of symbolic links, each holding exactly what a layer may reach.
#   private/<layer>/<layer>          -> src/<layer>              ("<layer>/..." for the layer's own sources)
#   public/<layer>/slimquant/<layer> -> include/slimquant/<layer> (propagated to the layers that link it)
#   detail/<layer>/<path>            -> src/<path>, for each header of the layer's `detail` interface
# A layer's sources therefore compile with its own src/<layer>, the public headers of itself and of
# the layers it links (transitively), and the detail headers it asks for; an include of anything
# else fails with "No such file or directory". Layers may link only layers declared before them, so
# the graph has no cycles by construction.

set(SLIMQUANT_LAYER_VIEWS ${PROJECT_BINARY_DIR}/layer_views)
# Rebuilt at every configure: a header dropped from a detail list must stop being reachable.
file(REMOVE_RECURSE ${SLIMQUANT_LAYER_VIEWS})
set(SLIMQUANT_LAYER_TARGETS)  # the OBJECT libraries, in declaration order (bottom layer first)

function(_slimquant_link_view original link)
  get_filename_component(parent ${link} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  file(CREATE_LINK ${original} ${link} SYMBOLIC RESULT failed)
  if(failed)
    message(FATAL_ERROR "slimquant layers: cannot create the symbolic link ${link} -> ${original}: ${failed}")
  endif()
endfunction()

# The compile setup of `target` as a source file of `layer`: its private view, the layer's links
# (their public views) and its detail interfaces. Used for the layer itself and for the layering
# probes of tests/layering/.
function(_slimquant_as_layer target layer)
  get_target_property(detail slimquant_${layer} SLIMQUANT_DETAIL_OF)
  target_include_directories(${target} PRIVATE ${SLIMQUANT_LAYER_VIEWS}/private/${layer})
  if(NOT target STREQUAL "slimquant_${layer}")
    target_link_libraries(${target} PRIVATE slimquant_${layer})
  endif()
  target_link_libraries(${target} PRIVATE slimquant_third_party)
  foreach(owner IN LISTS detail)
    target_link_libraries(${target} PRIVATE slimquant_${owner}_detail)
  endforeach()
  target_compile_options(${target} PRIVATE ${SLIMQUANT_WARNINGS})
endfunction()

# The standard headers most files of every layer include, precompiled once per layer: parsing them
# was a third of each file's compile time (about 96,000 preprocessed lines for a 200-line kernel).
set(SLIMQUANT_LAYER_PRECOMPILED_HEADERS
    <algorithm> <cmath> <cstdint> <cstring> <filesystem> <functional> <limits> <map> <memory> <optional>
    <set> <sstream> <string> <unordered_map> <vector>)

# The sources the sanitized run compiles again with ASan and UBSan (cmake/slimquant_sanitized.cmake):
# the code that parses untrusted input and the kernels that compute their own indices. Here because
# the layers group their sources for unity builds (below) by whether they are on this list.
set(SLIMQUANT_SANITIZED_SOURCE_GLOBS
    core/npy.cpp core/tensor.cpp core/atomic_file.cpp
    ir/onnx_io.cpp ir/graph.cpp ir/schema_checks.cpp
    data/*.cpp
    quant/quant_config.cpp
    runtime/session*.cpp runtime/kernels/*/*.cpp)
# Kernels that only describe and call oneDNN primitives (oneDNN's JIT code is not instrumented anyway).
set(SLIMQUANT_UNSANITIZED_SOURCE_REGEX
    "/runtime/kernels/dnnl/(dnnl_descriptors|dnnl_common|dnnl_batchnorm|dnnl_softmax|dnnl_layernorm|implementation_choice)\\.cpp$|_register\\.cpp$")

# The sanitized list's files of `layer`, in `out`.
function(slimquant_sanitized_sources layer out)
  set(picked)
  foreach(pattern IN LISTS SLIMQUANT_SANITIZED_SOURCE_GLOBS)
    if(pattern MATCHES "^${layer}/")
      file(GLOB matches CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${pattern})
      list(APPEND picked ${matches})
    endif()
  endforeach()
  list(FILTER picked EXCLUDE REGEX "${SLIMQUANT_UNSANITIZED_SOURCE_REGEX}")
  list(REMOVE_DUPLICATES picked)
  list(SORT picked)
  set(${out} ${picked} PARENT_SCOPE)
endfunction()

# Unity build: SLIMQUANT_UNITY_BATCH source files of a layer compiled as one translation unit, so
# the headers and templates they share are parsed, instantiated and optimised once per batch
# (measured: analysis 54.5 -> 33.2 s of compiler CPU for 8 files, runtime kernels about 20% less).
# The batches are named groups: `<layer>_sanitized_<n>` hold only files of the sanitized list, so the
# sanitized build compiles the same batches instrumented and leaves out exactly their normal
# objects. Each file's internal names must differ from those of every other file of its layer.
# 0 compiles each file alone (the check that every file includes what it uses).
set(SLIMQUANT_UNITY_BATCH 8 CACHE STRING "Source files of a layer compiled together as one translation unit (0: each alone)")

function(_slimquant_unity_groups target layer sources)
  if(NOT SLIMQUANT_UNITY_BATCH GREATER 0)
    return()
  endif()
  slimquant_sanitized_sources(${layer} sanitized)
  set(others ${sources})
  if(sanitized)
    list(REMOVE_ITEM others ${sanitized})
  endif()
  list(SORT others)
  foreach(kind IN ITEMS sanitized others)
    set(index 0)
    set(group_name ${layer})
    if(kind STREQUAL "sanitized")
      set(group_name ${layer}_sanitized)
    endif()
    foreach(source IN LISTS ${kind})
      math(EXPR batch "${index} / ${SLIMQUANT_UNITY_BATCH}")
      set_source_files_properties(${source} PROPERTIES UNITY_GROUP ${group_name}_${batch})
      math(EXPR index "${index} + 1")
    endforeach()
  endforeach()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
endfunction()

# slimquant_add_layer(<layer> [LAYERS <lower layers it uses>...] [DETAIL <layers whose detail it reads>...]
#                     [PRECOMPILE <third-party headers>...])
# Compiles every .cpp under src/<layer>/ (globbed: new files are picked up at the next build), with
# the standard headers above and the PRECOMPILE ones (heavy third-party headers most of its files
# include, directly or through the layer's headers) precompiled. Only system and third-party
# headers go there: a project header in it would hide a missing include from the layering checks.
function(slimquant_add_layer layer)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LAYERS;DETAIL;PRECOMPILE")
  foreach(dep IN LISTS arg_LAYERS arg_DETAIL)
    if(NOT TARGET slimquant_${dep})
      message(FATAL_ERROR "layer ${layer} uses layer '${dep}', which is not declared before it: a layer "
                          "may only use the layers below it (declared earlier in CMakeLists.txt)")
    endif()
  endforeach()
  foreach(owner IN LISTS arg_DETAIL)
    if(NOT TARGET slimquant_${owner}_detail)
      message(FATAL_ERROR "layer ${layer} reads the detail interface of '${owner}', which declares none")
    endif()
  endforeach()
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${layer}/*.cpp)
  set(target slimquant_${layer})
  add_library(${target} OBJECT ${sources})
  _slimquant_link_view(${PROJECT_SOURCE_DIR}/src/${layer} ${SLIMQUANT_LAYER_VIEWS}/private/${layer}/${layer})
  set(public_view ${SLIMQUANT_LAYER_VIEWS}/public/${layer})
  if(EXISTS ${PROJECT_SOURCE_DIR}/include/slimquant/${layer})
    _slimquant_link_view(${PROJECT_SOURCE_DIR}/include/slimquant/${layer} ${public_view}/slimquant/${layer})
  else()
    file(MAKE_DIRECTORY ${public_view})
  endif()
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${public_view}>)
  foreach(dep IN LISTS arg_LAYERS)
    target_link_libraries(${target} PUBLIC slimquant_${dep})
  endforeach()
  set_target_properties(${target} PROPERTIES SLIMQUANT_DETAIL_OF "${arg_DETAIL}"
                                             SLIMQUANT_PRECOMPILED_HEADERS "${SLIMQUANT_LAYER_PRECOMPILED_HEADERS};${arg_PRECOMPILE}")
  _slimquant_as_layer(${target} ${layer})
  target_precompile_headers(${target} PRIVATE ${SLIMQUANT_LAYER_PRECOMPILED_HEADERS} ${arg_PRECOMPILE})
  _slimquant_unity_groups(${target} ${layer} "${sources}")
  set(SLIMQUANT_LAYER_TARGETS ${SLIMQUANT_LAYER_TARGETS} ${target} PARENT_SCOPE)
endfunction()

# slimquant_layer_detail(<layer> <path under src/>...): the layer's `detail` interface, internal
# headers (or whole folders) that layers above it may include, at their usual path ("runtime/...").
# Kept short on purpose: each entry is a contract between two layers, documented in ARCHITECTURE.md.
function(slimquant_layer_detail layer)
  set(view ${SLIMQUANT_LAYER_VIEWS}/detail/${layer})
  file(MAKE_DIRECTORY ${view})
  foreach(path IN LISTS ARGN)
    if(NOT path MATCHES "^${layer}/")
      message(FATAL_ERROR "slimquant_layer_detail(${layer}): '${path}' is not under src/${layer}/")
    endif()
    # A folder may not exist yet (created by a later change): the link then dangles harmlessly.
    _slimquant_link_view(${PROJECT_SOURCE_DIR}/src/${path} ${view}/${path})
  endforeach()
  add_library(slimquant_${layer}_detail INTERFACE)
  target_include_directories(slimquant_${layer}_detail INTERFACE $<BUILD_INTERFACE:${view}>)
  target_link_libraries(slimquant_${layer}_detail INTERFACE slimquant_${layer})
endfunction()

# A layering probe for tests/layering/: `source` compiled exactly as a file of `layer`, built only on
# demand (a ctest builds it and checks the outcome).
function(slimquant_layer_probe name layer source)
  add_library(${name} OBJECT EXCLUDE_FROM_ALL ${source})
  _slimquant_as_layer(${name} ${layer})
endfunction()
