# GPU end-to-end tests: shell scripts given the tetra binary; exit 77 (no GPU, or a build
# without CUDA) counts as skipped. The Criterion programs tests/cuda/test_*.c are
# registered by the top CMakeLists.
file(GLOB TETRA_CUDA_SCRIPTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.sh)
# Each has a limit well inside tools/gpu-check's tests stage (110 s; every one of them
# together took 55-67 s on an H200), so that one hung test costs that test, not the stage;
# the multi-GPU ones (four GPUs, left out on fewer) get more.
foreach(script ${TETRA_CUDA_SCRIPTS})
  get_filename_component(name ${script} NAME_WE)
  set(limit 60)
  if(name MATCHES "^multigpu_")
    set(limit 300)
  endif()
  set(env "OMP_NUM_THREADS=2")
  if(TETRA_CUDA_EMU)   # on the emulated device (tests/emu/README.md): slower, cuBLASLt there
    set(limit 900)
    list(APPEND env "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/emu-lib")
  endif()
  add_test(NAME cuda/${name} COMMAND bash ${script} $<TARGET_FILE:tetra>)
  set_tests_properties(cuda/${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${limit}
                       ENVIRONMENT "${env}")
endforeach()

# The GPU benchmarks of tools/gpu-check (gpu_bench: GEMMs, attention, a layer;
# kernels_cuda: GB/s of the memory-bound kernels), built here (with the engine's warning
# flags) so that the CUDA build compiles them in CI too.
if(TETRA_HAVE_CUDA)
  add_executable(gpu_bench ${CMAKE_SOURCE_DIR}/tools/bench/gpu_bench.c)
  target_link_libraries(gpu_bench PRIVATE tetra_engine CUDA::cublas)
  # Attention TFLOP/s, cuDNN against the fallback kernel (tools/bench/attention_cuda.sh).
  add_executable(attention_cuda ${CMAKE_SOURCE_DIR}/tools/bench/attention_cuda.c)
  target_link_libraries(attention_cuda PRIVATE tetra_engine)
  # GB/s of the memory-bound kernels against a device-to-device copy.
  add_executable(kernels_cuda ${CMAKE_SOURCE_DIR}/tools/bench/kernels_cuda.c)
  target_link_libraries(kernels_cuda PRIVATE tetra_engine)
endif()
