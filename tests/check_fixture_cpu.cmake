# Runs `flashbox check-fixture` (CPU) on the official fixtures one-shot and with 7-row chunks.
# Asserts: it runs (exit 0 PASS or 1 FAIL, never 2), prints the contract's summary line, and the
# chunked run's summary equals the one-shot run's (chunked prefill is bit-identical). The strict
# PASS gate is reported, not asserted: see docs/reference-executor.md for why these synthetic
# fixtures cannot meet it on a CPU other than the one that made them.
foreach(case tiny-s0 tiny-s1-long)
  set(lines "")
  foreach(chunk 0 7)
    execute_process(COMMAND ${FLASHBOX} check-fixture ${SHARED}/fixtures/${case} --chunk ${chunk}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT (rc EQUAL 0 OR rc EQUAL 1))
      message(FATAL_ERROR "check-fixture ${case} --chunk ${chunk}: exit ${rc}\n${out}\n${err}")
    endif()
    string(REGEX MATCH "check-fixture [^\n]*" line "${out}")
    if(line STREQUAL "")
      message(FATAL_ERROR "no summary line for ${case}:\n${out}")
    endif()
    message(STATUS "${line}")
    list(APPEND lines "${line}")
  endforeach()
  list(GET lines 0 a)
  list(GET lines 1 b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "chunked prefill changed the result:\n  ${a}\n  ${b}")
  endif()
endforeach()
