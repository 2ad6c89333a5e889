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
