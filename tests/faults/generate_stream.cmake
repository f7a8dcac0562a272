# `shardtrain generate` through real pipes and signals (tests/faults/generate_stream.sh): a closed stdout ends it with
# exit 0, SIGINT and SIGTERM at a known token (SHARDTRAIN_FAULT) keep the tokens printed and exit 130 / 143, on one
# rank and on two under mpirun. The setup case trains the checkpoint the others read.
set(generate_stream_cases pipe_ids pipe_text sigint_ids sigterm_text sigint_mpi pipe_lines sigint_lines)
set(generate_stream_work ${CMAKE_BINARY_DIR}/faults_generate_stream)
add_test(NAME faults.generate.setup
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/generate_stream.sh setup $<TARGET_FILE:shardtrain>
                 ${CMAKE_SOURCE_DIR}/configs/tiny.ini ${generate_stream_work})
set_tests_properties(faults.generate.setup PROPERTIES LABELS "cpu;fault" TIMEOUT 120 PROCESSORS 2
                     FIXTURES_SETUP generate_stream_ckpt)
set(generate_stream_tests)
foreach(c ${generate_stream_cases})
  add_test(NAME faults.generate.${c}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/generate_stream.sh ${c} $<TARGET_FILE:shardtrain>
                   ${CMAKE_SOURCE_DIR}/configs/tiny.ini ${generate_stream_work})
  list(APPEND generate_stream_tests faults.generate.${c})
endforeach()
# TIMEOUT: a run that does not stop ends at the script's own 60 s deadline per run; ctest's is the backstop.
set_tests_properties(${generate_stream_tests} PROPERTIES LABELS "cpu;fault" TIMEOUT 180 SKIP_RETURN_CODE 77
                     FIXTURES_REQUIRED generate_stream_ckpt
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
