# ctest install_consumer: installs this build into a fresh prefix (cmake --install), configures
# tests/install/consumer against it with find_package(slimquant) alone, builds it and runs it on a
# fixture model. Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR=, and -DCONSUMER_LINKER_FLAGS= the
# build's own (a sanitizer build's library needs its runtime linked into the consumer too).
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "consumer_test.cmake needs -D${var}=")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
# The package alone: the source tree's include/ and src/ must not be needed.
run_step("configure consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_LINKER_FLAGS}")
run_step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(fixtures ${SOURCE_DIR}/tests/fixtures/models)
run_step("run consumer" ${WORK_DIR}/build/consumer ${fixtures}/resnet_small.onnx ${fixtures}/resnet_small.input.npy
         ${fixtures}/resnet_small.logits.npy)
message(STATUS "${step_output}")
if(NOT step_output MATCHES "\nok\n")
  message(FATAL_ERROR "consumer did not print ok:\n${step_output}")
endif()
# The installed command-line tool runs from the prefix.
run_step("installed slimquant --version" ${prefix}/bin/slimquant --version)
