# dist.bootstrap=env for real (tests/comm/env_bootstrap_test.py): shardtrain processes on 127.0.0.1 with the
# environment a Kubernetes Indexed Job pod (through launch/pod_launch.sh) or torchrun gives them, against an
# `mpirun -np 4` run of the same config; and the rendezvous's and a dead peer's failures with their exit codes.
# Each case picks its own free port (bind to port 0), so they run in parallel with everything else.
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
if(NOT SYSTEM_PYTHON3)
  return()
endif()
set(env_bootstrap_tests)
set(env_bootstrap_cases missing_rank wrong_port kill fail stopped)
if(MPIRUN_EXECUTABLE)
  list(APPEND env_bootstrap_cases pod torchrun)
endif()
foreach(case ${env_bootstrap_cases})
  add_test(NAME comm.env_bootstrap.${case}
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/comm/env_bootstrap_test.py ${case}
                   $<TARGET_FILE:shardtrain> "${MPIRUN_EXECUTABLE}" ${CMAKE_BINARY_DIR}/env_bootstrap_${case}
                   ${CMAKE_SOURCE_DIR}/configs/tiny.ini --train.steps=8 --train.global_batch=12 --train.micro_batch=1
                   --model.seq_len=64 --optim.lr=1e-3 --optim.eps=1e-6)
  list(APPEND env_bootstrap_tests comm.env_bootstrap.${case})
endforeach()
set_tests_properties(${env_bootstrap_tests} PROPERTIES LABELS "cpu;comm" TIMEOUT 300 PROCESSORS 2
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
if(MPIRUN_EXECUTABLE)
  set_tests_properties(comm.env_bootstrap.pod comm.env_bootstrap.torchrun PROPERTIES LABELS "cpu;comm;mpi")
endif()

# Commands that do not communicate join no world: with a pod's variables set (WORLD_SIZE=4, rank 1) --help-env
# answers at once (a rendezvous would wait for rank 0, which never comes) and lists the bootstrap's variables.
add_test(NAME comm.env_bootstrap.help_env_in_a_pod
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh 0 "^  JOB_COMPLETION_INDEX " --
                 $<TARGET_FILE:shardtrain> --help-env)
# Inconsistent variables stop before any connection: exit 2 naming the variable and its value.
add_test(NAME comm.env_bootstrap.rank_outside_world
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh 2
                 "environment variable RANK=4 is outside \\[0, 3\\]" --
                 $<TARGET_FILE:shardtrain> train --config ${CMAKE_SOURCE_DIR}/configs/tiny.ini --train.steps=1)
set_tests_properties(comm.env_bootstrap.help_env_in_a_pod PROPERTIES LABELS "cpu;comm" TIMEOUT 30
                     ENVIRONMENT "WORLD_SIZE=4;RANK=1;MASTER_ADDR=127.0.0.1;MASTER_PORT=9")
set_tests_properties(comm.env_bootstrap.rank_outside_world PROPERTIES LABELS "cpu;comm" TIMEOUT 30
                     ENVIRONMENT "WORLD_SIZE=4;RANK=4;MASTER_ADDR=127.0.0.1")
