# Multi-rank checks of engine/dist that need no Lua: comm_check runs every collective,
# the mesh, the differentiable collectives and the reducer on 1, 2 and 4 ranks.
find_program(TETRA_MPIRUN NAMES mpirun mpiexec)
add_executable(dist_comm_check ${CMAKE_CURRENT_LIST_DIR}/comm_check.c)
target_link_libraries(dist_comm_check PRIVATE tetra_engine)
add_test(NAME dist/comm_check_np1 COMMAND dist_comm_check)
if(TETRA_MPIRUN)
  foreach(np 2 4)
    add_test(NAME dist/comm_check_np${np}
             COMMAND ${TETRA_MPIRUN} --oversubscribe -np ${np} $<TARGET_FILE:dist_comm_check>)
  endforeach()
endif()
foreach(np 1 2 4)
  if(TEST dist/comm_check_np${np})
    set_tests_properties(dist/comm_check_np${np} PROPERTIES TIMEOUT 120 ENVIRONMENT
      "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
  endif()
endforeach()
