# launch/mpirun.sh: the mpirun line it builds for two LAN workstations (printed, not run), and a real local run of
# 2 ranks through it on the cpu backend.
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
add_test(NAME launch.mpirun.lan_line
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh 0
                 "^mpirun --hostfile ${CMAKE_SOURCE_DIR}/launch/hostfile.example -np 4 --map-by ppr:2:node --bind-to none --mca btl_tcp_if_include enp5s0 --mca oob_tcp_if_include enp5s0 (-x [A-Z_]+ )*-x NCCL_IB_DISABLE (-x [A-Z_]+ )*-x NCCL_SOCKET_IFNAME .*shardtrain train --dist.sharding=hybrid$" --
                 ${CMAKE_SOURCE_DIR}/launch/mpirun.sh --dry-run --hostfile ${CMAKE_SOURCE_DIR}/launch/hostfile.example
                 --gpus-per-host 2 --iface enp5s0 -- $<TARGET_FILE:shardtrain> train --dist.sharding=hybrid)
set_tests_properties(launch.mpirun.lan_line PROPERTIES LABELS cpu TIMEOUT 30)
if(MPIRUN_EXECUTABLE)
  add_test(NAME launch.mpirun.local_2_ranks
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh 0 "done: 2 steps .0 skipped." --
                   ${CMAKE_SOURCE_DIR}/launch/mpirun.sh --gpus-per-host 2 -- $<TARGET_FILE:shardtrain> train
                   --train.steps=2 --train.sample_tokens=0 --train.eval_every=0 --train.global_batch=4
                   --train.micro_batch=2)
  set_tests_properties(launch.mpirun.local_2_ranks PROPERTIES LABELS "cpu;mpi" TIMEOUT 120 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
