# SIGTERM and SIGINT to launch/mpirun.sh running 2 cpu ranks: exit 76 and a checkpoint committed at the step boundary
# after the signal (tests/faults/mpirun_signals.sh). Skipped where mpirun is not installed.
foreach(sig TERM INT)
  string(TOLOWER ${sig} sig_name)
  add_test(NAME faults.mpirun_signals.sig${sig_name}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/faults/mpirun_signals.sh ${sig} ${CMAKE_SOURCE_DIR}
                   $<TARGET_FILE:shardtrain> ${CMAKE_BINARY_DIR}/faults_mpirun_sig${sig_name})
  set_tests_properties(faults.mpirun_signals.sig${sig_name} PROPERTIES
                       LABELS "cpu;fault;mpi" PROCESSORS 2 TIMEOUT 180 SKIP_RETURN_CODE 77
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endforeach()
