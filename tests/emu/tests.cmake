# The CUDA kernels of kernels/cuda/ run on the CPU (tests/emu/README.md): each source is
# rewritten by tests/emu/translate (its launches become calls into the emulator) and
# compiled by the host's C++ compiler with tests/emu/cuda_emu.h in front, then linked with
# the CPU twins (tetra_kernels_cpu) into one Criterion program that compares them. Needs
# the CUDA toolkit's headers (the types: bf16, fp8, the runtime's declarations), not a
# GPU, not nvcc and not libcudart, so a CPU-only build (TETRA_CUDA=OFF, as tools/mutate's
# trees) has it too wherever the toolkit is installed. kernels/cuda/matmul.cu is left out:
# it is cuBLASLt calls.
find_path(TETRA_EMU_CUDA_INCLUDE NAMES cuda_fp8.h   # (CUDA 11.8 and later)
          HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
          PATH_SUFFIXES include)
# (translate is Perl: every machine with git has it, a bare toolchain root may not.)
find_program(TETRA_PERL perl)
# (cublasLt.h for the emulated cuBLASLt's own test, test_emu_runtime.cc)
if(TETRA_EMU_CUDA_INCLUDE AND EXISTS ${TETRA_EMU_CUDA_INCLUDE}/cublasLt.h AND CRITERION_FOUND
   AND TETRA_PERL)
  file(GLOB TETRA_EMU_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
  list(REMOVE_ITEM TETRA_EMU_KERNELS ${CMAKE_SOURCE_DIR}/kernels/cuda/matmul.cu)
  # and the engine's strided copy (its geometry from engine/core/copy_geom.c)
  list(APPEND TETRA_EMU_KERNELS ${CMAKE_SOURCE_DIR}/engine/cuda/copy.cu)
  tetra_emu_sources(TETRA_EMU_SOURCES emu ${TETRA_EMU_KERNELS})
  add_executable(test_emu_kernels ${CMAKE_SOURCE_DIR}/tests/emu/test_emu_kernels.cc
    ${CMAKE_SOURCE_DIR}/tests/emu/test_emu_copy.cc ${CMAKE_SOURCE_DIR}/tests/emu/test_emu_runtime.cc
    ${CMAKE_SOURCE_DIR}/tests/emu/cublaslt_emu.cc ${CMAKE_SOURCE_DIR}/tests/emu/cuda_emu.cc
    ${CMAKE_SOURCE_DIR}/tests/emu/emu_engine_stubs.cc
    ${CMAKE_SOURCE_DIR}/engine/core/copy_geom.c ${TETRA_EMU_SOURCES})
  set_target_properties(test_emu_kernels PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_include_directories(test_emu_kernels PRIVATE ${CMAKE_SOURCE_DIR}/tests/emu
    ${CMAKE_SOURCE_DIR}/kernels/cuda ${CMAKE_SOURCE_DIR}/engine/cuda)
  target_include_directories(test_emu_kernels SYSTEM PRIVATE ${TETRA_EMU_CUDA_INCLUDE})
  target_link_libraries(test_emu_kernels PRIVATE tetra_kernels_cpu PkgConfig::CRITERION
    PkgConfig::OPENBLAS)
  add_test(NAME emu/kernels COMMAND test_emu_kernels --jobs=1)
  # The same with blocks and threads run last to first (cuda_emu.cc, TT_EMU_ORDER).
  add_test(NAME emu/kernels_reversed COMMAND test_emu_kernels --jobs=1)
  set_tests_properties(emu/kernels_reversed PROPERTIES ENVIRONMENT TT_EMU_ORDER=reverse)
  if(TETRA_SANITIZE)
    # A host access to device memory must end the process by SIGSEGV, as on a GPU
    # machine (emu_runtime's host_read_of_device_memory_faults): AddressSanitizer's own
    # handler, which the emulator's chains to, would end it by SIGABRT.
    set_property(TEST emu/kernels emu/kernels_reversed APPEND PROPERTY ENVIRONMENT
                 "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:handle_segv=0")
  endif()
endif()
