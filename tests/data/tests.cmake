# Tokenizer parity against the Python references (tokenizers, tiktoken). Each case exits
# 77 when its reference package (or GPT-2's rank file) is missing: ctest shows it as
# skipped. tools/setup-python-refs installs the references.
# python3 from PATH: the interpreter where pip installed the references.
find_program(TETRA_PYTHON3 NAMES python3)
add_executable(tt_tokenizer_driver ${CMAKE_SOURCE_DIR}/tests/data/tokenizer_driver.c)
target_link_libraries(tt_tokenizer_driver PRIVATE tetra_engine)
if(TETRA_PYTHON3)
  foreach(case hf tetra gpt2)
    add_test(NAME data/tokenizer_parity_${case}
      COMMAND ${TETRA_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/data/parity.py
              --tetra $<TARGET_FILE:tt_tokenizer_driver> --case ${case})
    set_tests_properties(data/tokenizer_parity_${case} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
  endforeach()
endif()
