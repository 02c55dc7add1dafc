# `flashbox run --kv-cache DIR` across processes (issue 21): the second run of the same prompt
# restores it from the folder (every prompt token cached) and prints the same greedy text as the
# first and as a run without the cache; `flashbox kv ls|verify|rm` list the prompt's checkpoint and
# the conversation's (a delta of it), find a flipped byte in the prompt's (exit 1; the delta built
# on it is then never served either) and remove them. A make-tiny model in a scratch folder (WORK).
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${FLASHBOX} make-tiny --out ${WORK}/m RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make-tiny: exit ${rc}\n${err}")
endif()
set(i 0)
foreach(flags "--kv-cache;${WORK}/kv" "--kv-cache;${WORK}/kv" "")
  execute_process(COMMAND ${FLASHBOX} run --model ${WORK}/m -p "The cache keeps the prompt" --max-tokens 10 --temperature 0 ${flags}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out${i} ERROR_VARIABLE err${i})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run ${flags}: exit ${rc}\n${out${i}}\n${err${i}}")
  endif()
  math(EXPR i "${i} + 1")
endforeach()
string(REGEX MATCH "\\[([0-9]+) prompt tokens \\(([0-9]+) cached\\)" m "${err1}")
if(NOT m OR NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
  message(FATAL_ERROR "the second run did not restore the whole prompt:\n${err1}")
endif()
set(prompt_n ${CMAKE_MATCH_1})
if(NOT out0 STREQUAL out1 OR NOT out0 STREQUAL out2)
  message(FATAL_ERROR "the text changed with the cache:\n[${out0}]\n[${out1}]\n[${out2}]")
endif()
execute_process(COMMAND ${FLASHBOX} kv ls ${WORK}/kv RESULT_VARIABLE rc OUTPUT_VARIABLE ls)
# the prompt's checkpoint, and the conversation's (prompt + answer, for the next turn) as a delta of it
if(NOT rc EQUAL 0 OR NOT ls MATCHES "2 checkpoints" OR NOT ls MATCHES "delta of the ${prompt_n}-token checkpoint")
  message(FATAL_ERROR "kv ls: exit ${rc}\n${ls}")
endif()
file(GLOB ckpt ${WORK}/kv/*-${prompt_n}.fbkv)
# Flip one byte of the state in place.
execute_process(COMMAND ${PYTHON} -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 1]))"
                        ${ckpt} RESULT_VARIABLE rc ERROR_VARIABLE perr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not damage ${ckpt}: ${perr}")
endif()
execute_process(COMMAND ${FLASHBOX} kv verify ${WORK}/kv RESULT_VARIABLE rc OUTPUT_VARIABLE vout)
if(NOT rc EQUAL 1 OR NOT vout MATCHES "DAMAGED")
  message(FATAL_ERROR "kv verify must find the flipped byte (exit 1): exit ${rc}\n${vout}")
endif()
# The damaged checkpoint is not served: the run prefills cold and prints the same text.
execute_process(COMMAND ${FLASHBOX} run --model ${WORK}/m -p "The cache keeps the prompt" --max-tokens 10 --temperature 0 --kv-cache ${WORK}/kv
                RESULT_VARIABLE rc OUTPUT_VARIABLE out3 ERROR_VARIABLE err3)
if(NOT rc EQUAL 0 OR NOT out3 STREQUAL out0 OR NOT err3 MATCHES "\\(0 cached\\)")
  message(FATAL_ERROR "a damaged checkpoint must be skipped: exit ${rc}\n[${out3}]\n${err3}")
endif()
execute_process(COMMAND ${FLASHBOX} kv rm ${WORK}/kv --all RESULT_VARIABLE rc OUTPUT_QUIET)
file(GLOB left ${WORK}/kv/*.fbkv)
if(NOT rc EQUAL 0 OR left)
  message(FATAL_ERROR "kv rm --all: exit ${rc}, left: ${left}")
endif()
