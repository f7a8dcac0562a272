# `shardtrain ckpt inspect|verify|export` end to end, against ckpt.export's HDF5 (tests/ckpt/export_test.py).
find_program(CKPT_TOOLS_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(CKPT_TOOLS_PYTHON3)
  add_test(NAME ckpt.tools.export
           COMMAND ${CKPT_TOOLS_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/ckpt/export_test.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/ckpt_tools_export)
  set_tests_properties(ckpt.tools.export PROPERTIES LABELS "cpu;ckpt" TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
endif()
