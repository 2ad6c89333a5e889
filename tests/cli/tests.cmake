# Shell tests of the tetra binary's command line: each tests/cli/*.sh runs as
# `bash SCRIPT /path/to/tetra` (exit 77 = skipped).
file(GLOB TETRA_CLI_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.sh)
foreach(script ${TETRA_CLI_TESTS})
  get_filename_component(name ${script} NAME_WE)
  add_test(NAME cli/${name} COMMAND bash ${script} $<TARGET_FILE:tetra>)
  set_tests_properties(cli/${name} PROPERTIES
    ENVIRONMENT "OMP_NUM_THREADS=2;TETRA_HISTORY=;PYTHON=${TETRA_PYTHON3}" SKIP_RETURN_CODE 77
    TIMEOUT 120)
endforeach()
# The fuzz smoke test builds four targets with clang before running each for 10 s.
if(TEST cli/fuzz_smoke)
  set_tests_properties(cli/fuzz_smoke PROPERTIES TIMEOUT 400)
endif()
# Six training runs side by side (with and without a scraper) and one under hostile
# clients: about 45 s alone, more on a busy machine.
if(TEST cli/prometheus_endpoint)
  set_tests_properties(cli/prometheus_endpoint PROPERTIES TIMEOUT 240)
endif()
# Hugging Face interop: four small models trained, each converted both ways and run by
# transformers (three Python starts), plus the refusals: about a minute alone, more on a
# busy machine.
if(TEST cli/hf_convert)
  set_tests_properties(cli/hf_convert PROPERTIES TIMEOUT 400)
endif()
# The layer profiler trains each of two pipeline splits twice under mpirun (4 steps);
# it asserts no timing between the splits, so it shares the machine like the others.
if(TEST cli/profile)
  set_tests_properties(cli/profile PROPERTIES TIMEOUT 300)
endif()
