# `flashbox run` with the expert tiers (--expert-slots, --host-experts) gives the same greedy text
# as with every expert resident: the serve/chat/run flags reach the executor factory, and tiering
# moves bytes, never changes them. A make-tiny model in a scratch folder (WORK).
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${FLASHBOX} make-tiny --out ${WORK}/m RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make-tiny: exit ${rc}\n${err}")
endif()
# Outputs are kept in separate variables: the text carries ANSI escapes ("[") that CMake lists mangle.
set(i 0)
foreach(flags "" "--expert-slots;1" "--expert-slots;2;--host-experts;3")
  execute_process(COMMAND ${FLASHBOX} run --model ${WORK}/m -p "The tiers move bytes" --max-tokens 12 --temperature 0 ${flags}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out${i} ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run ${flags}: exit ${rc}\n${out${i}}\n${err}")
  endif()
  math(EXPR i "${i} + 1")
endforeach()
string(LENGTH "${out0}" n)
if(n LESS 10)
  message(FATAL_ERROR "run printed no text: '${out0}'")
endif()
foreach(k 1 2)
  if(NOT out0 STREQUAL out${k})
    message(FATAL_ERROR "the expert tiers changed run's output (case ${k}):\n--- resident\n${out0}\n--- tiered\n${out${k}}")
  endif()
endforeach()
# A tier flag without --expert-slots is refused with a message.
execute_process(COMMAND ${FLASHBOX} run --model ${WORK}/m -p "x" --max-tokens 1 --host-experts 3 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "need --expert-slots")
  message(FATAL_ERROR "--host-experts without --expert-slots was not refused: exit ${rc}\n${err}")
endif()
file(REMOVE_RECURSE ${WORK})
