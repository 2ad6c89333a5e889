# Tokenizer parity against the Python references (tokenizers, tiktoken), run by
# TETRA_PYTHON3 (the references' venv, CMakeLists.txt). Each case exits 77 when its
# reference package (or GPT-2's rank file) is missing — ctest shows it as skipped — and 1
# under CI=true. tools/setup-python-refs installs the references.
add_executable(tt_tokenizer_driver ${CMAKE_SOURCE_DIR}/tests/data/tokenizer_driver.c)
target_link_libraries(tt_tokenizer_driver PRIVATE tetra_engine)
if(TETRA_PYTHON3)
  foreach(case hf tetra gpt2)
    add_test(NAME data/tokenizer_parity_${case}
      COMMAND ${TETRA_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/data/parity.py
              --tetra $<TARGET_FILE:tt_tokenizer_driver> --case ${case})
    set_tests_properties(data/tokenizer_parity_${case} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
  endforeach()
else()
  add_test(NAME data/tokenizer_parity COMMAND sh -c
    "echo 'no python3: run tools/setup-python-refs'; [ \"$CI\" = true ] && exit 1; exit 77")
  set_tests_properties(data/tokenizer_parity PROPERTIES SKIP_RETURN_CODE 77)
endif()

# s3:// and TFRecord data against a real S3-compatible server (moto, from the venv).
add_test(NAME data/s3 COMMAND bash ${CMAKE_SOURCE_DIR}/tests/data/s3.sh $<TARGET_FILE:tetra>
         ${CMAKE_SOURCE_DIR}/.deps/venv/bin/python3)
set_tests_properties(data/s3 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
