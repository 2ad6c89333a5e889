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

# Parallel layouts against the single-process run, one ctest dist/layout/NAME per row of
# layouts.txt (its header describes the columns): tools/compare_loss runs the recipe once
# as one process and once under mpirun with the layout, and compares loss and grad_norm
# at every step. Without mpirun a test is skipped (77), or fails under CI=true. A
# malformed row stops the configure step.
function(tetra_layout_test where row root)
  string(REPLACE "|" ";" cols "${row}")
  list(LENGTH cols ncols)
  if(ncols LESS 5 OR ncols GREATER 6)
    message(FATAL_ERROR "${where}: want 5 or 6 columns separated by |, got ${ncols}")
  endif()
  set(options "")
  set(i 0)
  foreach(field name np recipe layout common options)
    if(i LESS ncols)
      list(GET cols ${i} value)
      string(STRIP "${value}" ${field})
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  if(NOT name MATCHES "^[A-Za-z0-9_.-]+$")
    message(FATAL_ERROR "${where}: bad test name '${name}'")
  endif()
  if(TEST dist/layout/${name})
    message(FATAL_ERROR "${where}: test name '${name}' used twice")
  endif()
  if(NOT np MATCHES "^[1-9][0-9]*$")
    message(FATAL_ERROR "${where}: np must be a rank count, got '${np}'")
  endif()
  if(NOT EXISTS ${root}/${recipe})
    message(FATAL_ERROR "${where}: no recipe ${recipe}")
  endif()
  set(args --tetra $<TARGET_FILE:tetra> --np ${np} --skip-status 77
           --out ${CMAKE_BINARY_DIR}/dist_layout/${name})
  foreach(kind layout options common)
    set(items "")
    if(NOT "${${kind}}" STREQUAL "" AND NOT "${${kind}}" STREQUAL "-")
      string(REGEX REPLACE "[ \t]+" ";" items "${${kind}}")
    endif()
    foreach(item IN LISTS items)
      if(kind STREQUAL "options")
        if(NOT item MATCHES "^(tol|gtol|gtol-early|early)=(.+)$")
          message(FATAL_ERROR
                  "${where}: unknown option '${item}' (tol, gtol, gtol-early, early)")
        endif()
        list(APPEND args --${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
      elseif(NOT item MATCHES "^[A-Za-z_][A-Za-z0-9_.]*=")
        message(FATAL_ERROR "${where}: '${item}' is not KEY=VALUE")
      elseif(kind STREQUAL "layout")
        list(APPEND args --layout ${item})
      else()
        list(APPEND common_args --set ${item})
      endif()
    endforeach()
  endforeach()
  add_test(NAME dist/layout/${name}
           COMMAND bash ${root}/tools/compare_loss ${args} ${root}/${recipe} ${common_args}
           WORKING_DIRECTORY ${root})
  set_tests_properties(dist/layout/${name} PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
    SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()

set(TETRA_LAYOUTS_FILE ${CMAKE_CURRENT_LIST_DIR}/layouts.txt)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${TETRA_LAYOUTS_FILE})
get_filename_component(TETRA_LAYOUTS_ROOT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
# Read as text and split by hand: a list built by file(STRINGS) would join lines at a
# trailing backslash or an unbalanced bracket (even in a comment) and drop rows silently.
file(READ ${TETRA_LAYOUTS_FILE} TETRA_LAYOUTS_TEXT)
string(REPLACE "\\" "<backslash>" TETRA_LAYOUTS_TEXT "${TETRA_LAYOUTS_TEXT}")
string(REPLACE "[" "<lbracket>" TETRA_LAYOUTS_TEXT "${TETRA_LAYOUTS_TEXT}")
string(REPLACE "]" "<rbracket>" TETRA_LAYOUTS_TEXT "${TETRA_LAYOUTS_TEXT}")
string(REPLACE ";" "<semicolon>" TETRA_LAYOUTS_TEXT "${TETRA_LAYOUTS_TEXT}")
string(REPLACE "\n" ";" TETRA_LAYOUTS_LINES "${TETRA_LAYOUTS_TEXT}")
set(TETRA_LAYOUTS_LINENO 0)
foreach(TETRA_LAYOUTS_ROW IN LISTS TETRA_LAYOUTS_LINES)
  math(EXPR TETRA_LAYOUTS_LINENO "${TETRA_LAYOUTS_LINENO} + 1")
  string(STRIP "${TETRA_LAYOUTS_ROW}" TETRA_LAYOUTS_ROW)
  if(TETRA_LAYOUTS_ROW STREQUAL "" OR TETRA_LAYOUTS_ROW MATCHES "^#")
    continue()
  endif()
  if(TETRA_LAYOUTS_ROW MATCHES "<(backslash|lbracket|rbracket|semicolon)>|#")
    message(FATAL_ERROR "${TETRA_LAYOUTS_FILE}:${TETRA_LAYOUTS_LINENO}: "
                        "a row holds none of \\ [ ] ; #")
  endif()
  tetra_layout_test("${TETRA_LAYOUTS_FILE}:${TETRA_LAYOUTS_LINENO}" "${TETRA_LAYOUTS_ROW}"
                    ${TETRA_LAYOUTS_ROOT})
endforeach()

# The multi-host tests (tests/dist/cluster_*.sh, registered with the other scripts) each
# bring up the same namespace cluster (tools/cluster --name ttest): one at a time.
file(GLOB TETRA_CLUSTER_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cluster_*.sh)
foreach(script ${TETRA_CLUSTER_TESTS})
  get_filename_component(name ${script} NAME_WE)
  set_tests_properties(dist/${name} PROPERTIES RESOURCE_LOCK tetra_cluster_ttest)
endforeach()

# The straggler test measures each rank's compute time against the others': it runs alone,
# so another test's ranks on the same cores do not make a fast rank look slow.
set_tests_properties(dist/straggler PROPERTIES RUN_SERIAL TRUE)
# So does the planner's sweep, which times each layout against the planner's prediction.
set_tests_properties(dist/plan_sweep PROPERTIES RUN_SERIAL TRUE)
