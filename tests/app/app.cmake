# `shardtrain plot`: a hand-written metrics file (repeated steps, nulls, evaluations, bad files) drawn and read back
# as XML; and a 2-rank run's metrics (mem_peak_bytes per rank, skipped_total with a step skipped on purpose) plotted.
if(SYSTEM_PYTHON3)
  add_test(NAME app.plot
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/plot_test.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/app_plot)
  set_tests_properties(app.plot PROPERTIES LABELS "cpu" TIMEOUT 60)
endif()
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME app.plot_trained_mpi
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/plot_test.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/app_plot_mpi ${MPIRUN_EXECUTABLE} ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set_tests_properties(app.plot_trained_mpi PROPERTIES LABELS "cpu;mpi" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
# `shardtrain generate` on 2 MPI ranks against one process, from checkpoints written by 1 and 2 ranks.
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME app.generate_mpi
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/generate_mpi_test.py $<TARGET_FILE:shardtrain>
                   ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/app_generate_mpi ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set_tests_properties(app.generate_mpi PROPERTIES LABELS "cpu;mpi" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
