# Failed writes (tests/faults/write_faults.sh): a save (in the background, while training waits, and with
# ckpt.on_error = warn), `ckpt export`, the trainer's ckpt.export, the metrics
# file and `plot --out` past the file-size limit, a save on a full private tmpfs, and an output path under a
# file. Included from tests/tests.cmake.
set(write_fault_cases save_fsize save_fsize_sync save_fsize_warn export_h5_fsize export_safetensors_fsize train_export_fsize save_enospc
                      metrics_fsize plot_fsize out_under_file)
set(write_fault_tests)
foreach(c ${write_fault_cases})
  add_test(NAME faults.write.${c}
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/write_faults.sh ${c} $<TARGET_FILE:shardtrain>
                   ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh ${CMAKE_SOURCE_DIR}/configs/tiny.ini
                   ${CMAKE_BINARY_DIR}/faults_write/${c})
  list(APPEND write_fault_tests faults.write.${c})
endforeach()
set_tests_properties(${write_fault_tests} PROPERTIES LABELS "cpu;fault" TIMEOUT 120 SKIP_RETURN_CODE 77)
