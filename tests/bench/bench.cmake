# The benchmark drivers' own logic, on the CPU backend (their numbers are measured on GPUs: bench/RESULTS.md).
add_test(NAME bench.ab_throughput
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/ab_throughput_test.sh ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE_DIR:shardtrain>)
set_tests_properties(bench.ab_throughput PROPERTIES LABELS "cpu" TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
