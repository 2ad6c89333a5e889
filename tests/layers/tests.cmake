# The engine's layering (tests/layers/check_layers.py says which layer sits on which):
# the libraries' objects, listed at generate time, are read with nm after the build.
# (the CPU kernels and error.c / dtype.c are tetra_kernels_cpu's objects, in the engine's
# archive too)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/tetra_engine_objects.txt
     CONTENT "$<JOIN:$<TARGET_OBJECTS:tetra_engine>,\n>\n$<JOIN:$<TARGET_OBJECTS:tetra_kernels_cpu>,\n>\n")
set(TETRA_LAYER_OBJECTS ${CMAKE_BINARY_DIR}/tetra_engine_objects.txt)
if(TETRA_HAVE_CUDA)
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/tetra_cuda_objects.txt
       CONTENT "$<JOIN:$<TARGET_OBJECTS:tetra_cuda>,\n>\n")
  list(APPEND TETRA_LAYER_OBJECTS ${CMAKE_BINARY_DIR}/tetra_cuda_objects.txt)
endif()
add_test(NAME c/layers COMMAND ${TETRA_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/check_layers.py
         ${CMAKE_SOURCE_DIR} ${TETRA_LAYER_OBJECTS})
