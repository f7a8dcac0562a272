# The benchmark drivers' own logic, on the CPU backend or on made-up logs (their numbers are measured on GPUs:
# docs/performance.md).
add_test(NAME bench.ab_throughput
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/ab_throughput_test.sh ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE_DIR:shardtrain>)
set_tests_properties(bench.ab_throughput PROPERTIES LABELS "cpu" TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
add_test(NAME bench.op_profile_compare
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/op_profile_compare_test.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(bench.op_profile_compare PROPERTIES LABELS "cpu" TIMEOUT 60)
add_test(NAME bench.kernel_trace_report
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/kernel_trace_report_test.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(bench.kernel_trace_report PROPERTIES LABELS "cpu" TIMEOUT 60)
