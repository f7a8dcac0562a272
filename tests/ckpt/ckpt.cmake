# Checkpoints with real processes under mpirun: bit-exact resume, resharding, killed ranks.
find_program(CKPT_MPIRUN NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND CKPT_MPIRUN)
  set(ckpt_cases resume-1 resume-2 reshard-2-3 reshard-3-2 reshard-4-1 reshard-1-4 kill-mid-write kill-before-rename enospc
                 kill-mid-write-sync enospc-sync)
  foreach(c ${ckpt_cases})
    add_test(NAME ckpt.process.${c}
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/ckpt/resume_faults_test.py $<TARGET_FILE:shardtrain>
                     ${CKPT_MPIRUN} ${CMAKE_BINARY_DIR}/ckpt_process_${c} ${c})
    set_tests_properties(ckpt.process.${c} PROPERTIES LABELS "cpu;mpi;ckpt" TIMEOUT 600 PROCESSORS 2
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
  endforeach()
  # The llama family: the same resume and resharding guarantees (its unit layout differs: no position table,
  # fused q/k/v and gate/up matrices, an untied head here).
  foreach(c resume-2 reshard-2-3)
    add_test(NAME ckpt.process.llama.${c}
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/ckpt/resume_faults_test.py $<TARGET_FILE:shardtrain>
                     ${CKPT_MPIRUN} ${CMAKE_BINARY_DIR}/ckpt_process_llama_${c} ${c}
                     ${CMAKE_BINARY_DIR}/tiny-llama-untied.ini)
    set_tests_properties(ckpt.process.llama.${c} PROPERTIES LABELS "cpu;mpi;ckpt" TIMEOUT 600 PROCESSORS 2
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
  endforeach()
  file(READ ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini tiny_llama_ini)
  string(REPLACE "[model]\n" "[model]\ntie_embeddings = false\n" tiny_llama_ini "${tiny_llama_ini}")
  file(WRITE ${CMAKE_BINARY_DIR}/tiny-llama-untied.ini "${tiny_llama_ini}")
endif()
