# Real-MPI tests of the comm layer: tests/tools/mpi_comm_check under mpirun for 1..4 ranks, and a run in
# which one rank fails and the whole job must end with that rank's error. Included from tests/tests.cmake.
#
# Flags: --oversubscribe (more ranks than cores), --mca btl self,vader (shared memory only: no network in
# a sandbox or CI container). Open MPI refuses to run as root unless told; CI containers run as root, so
# the tests say so themselves rather than rely on the caller's environment.

find_program(MPIEXEC_PROGRAM NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
if(NOT MPIEXEC_PROGRAM)
  message(WARNING "shardtrain: mpirun not found; the 'mpi' tests are not registered")
  return()
endif()

set(SHARDTRAIN_MPIRUN ${MPIEXEC_PROGRAM} --oversubscribe --mca btl self,vader)
set(expect_exit sh ${CMAKE_CURRENT_LIST_DIR}/expect_exit.sh)

set(comm_mpi_tests)
foreach(np 1 2 3 4)
  # Exit 0 on every rank and rank 0's summary: a run that checked nothing cannot pass.
  add_test(NAME comm.mpi.collectives.np${np}
           COMMAND ${expect_exit} 0 "^mpi_comm_check: world ${np}: [1-9][0-9]* checks, 0 failures: OK$" --
                   ${SHARDTRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_comm_check>)
  list(APPEND comm_mpi_tests comm.mpi.collectives.np${np})
endforeach()

# Rank 1 of 3 throws mid-run while ranks 0 and 2 wait in a collective: mpirun must exit with the fault
# code the launcher passed to MPI_Abort (75), and the output must carry rank 1's own message.
add_test(NAME comm.mpi.fail_rank1
         COMMAND ${expect_exit} 75 "rank 1/3 .*injected failure on rank 1 \\(--fail-rank\\)" --
                 ${SHARDTRAIN_MPIRUN} -np 3 $<TARGET_FILE:mpi_comm_check> --fail-rank 1)
list(APPEND comm_mpi_tests comm.mpi.fail_rank1)

set_tests_properties(${comm_mpi_tests} PROPERTIES LABELS "mpi;comm" TIMEOUT 60
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
