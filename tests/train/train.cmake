# Preemption: SIGTERM to one rank mid-run (1 process, and mpirun -np 2) commits a checkpoint and exits 76; a resume
# with ckpt.resume=auto repeats the uninterrupted losses exactly.
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME train.preemption
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/train/preempt_test.py $<TARGET_FILE:shardtrain>
                   ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/train_preemption ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set_tests_properties(train.preemption PROPERTIES LABELS "cpu;mpi" TIMEOUT 900 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
