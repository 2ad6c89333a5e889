# The engine's layering (tests/layers/check_layers.py says which layer sits on which):
# the library's objects, listed at generate time, are read with nm after the build.
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/tetra_engine_objects.txt
     CONTENT "$<JOIN:$<TARGET_OBJECTS:tetra_engine>,\n>\n")
add_test(NAME c/layers COMMAND ${TETRA_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/check_layers.py
         ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/tetra_engine_objects.txt)
