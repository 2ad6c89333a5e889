# tools/gpu-check, checked without a GPU: its reporting on canned logs (stage table,
# failures the exit status hides, the time budget), the CMake options it relies on
# (TETRA_REQUIRE_CUDA, TETRA_CUDA_ARCHS), and its set-up in a bare root made
# from Debian's toolchain packages (downloads the .debs once into the build tree; needs
# root and nvcc; several minutes, the build of the CUDA backend inside it being most).
add_test(NAME gpu_check/report
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/report.sh)
set_tests_properties(gpu_check/report PROPERTIES TIMEOUT 120)
add_test(NAME gpu_check/bare_root
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bare_root.sh ${CMAKE_BINARY_DIR}/gpu_check_bare_root)
set_tests_properties(gpu_check/bare_root PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
add_test(NAME gpu_check/configure
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/configure.sh)
set_tests_properties(gpu_check/configure PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180)
# Every weak tt_* reference of the programs that bring CUDA up is resolved (an object of
# libtetra_cuda.a that only weak references name is left out of the link, silently).
if(TETRA_HAVE_CUDA)
  add_test(NAME gpu_check/weak_symbols
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/weak_symbols.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(gpu_check/weak_symbols PROPERTIES TIMEOUT 60)
  # cuBLASLt is opened on first use, not linked; and says why when it cannot be.
  add_test(NAME gpu_check/blaslt_opened
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/blaslt_opened.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(gpu_check/blaslt_opened PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
