# Checkpoints with real processes under mpirun: bit-exact resume, resharding, killed ranks.
find_program(CKPT_MPIRUN NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND CKPT_MPIRUN)
  set(ckpt_cases resume-1 resume-2 reshard-2-3 reshard-3-2 reshard-4-1 reshard-1-4 kill-mid-write kill-before-rename enospc)
  foreach(c ${ckpt_cases})
    add_test(NAME ckpt.process.${c}
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/ckpt/resume_faults_test.py $<TARGET_FILE:shardtrain>
                     ${CKPT_MPIRUN} ${CMAKE_BINARY_DIR}/ckpt_process_${c} ${c})
    set_tests_properties(ckpt.process.${c} PROPERTIES LABELS "cpu;mpi;ckpt" TIMEOUT 600 PROCESSORS 2
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
  endforeach()
endif()
