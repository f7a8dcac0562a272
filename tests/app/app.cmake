# `shardtrain plot`: a hand-written metrics file (repeated steps, nulls, evaluations, bad files) drawn and read back
# as XML; and a 2-rank run's metrics (mem_peak_bytes per rank, skipped_total with a step skipped on purpose) plotted.
if(SYSTEM_PYTHON3)
  add_test(NAME app.plot
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/plot_test.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/app_plot)
  set_tests_properties(app.plot PROPERTIES LABELS "cpu" TIMEOUT 60)
endif()
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME app.plot_trained_mpi
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/plot_test.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/app_plot_mpi ${MPIRUN_EXECUTABLE} ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set_tests_properties(app.plot_trained_mpi PROPERTIES LABELS "cpu;mpi" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
# `shardtrain generate` on 2 MPI ranks against one process, from checkpoints written by 1 and 2 ranks.
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME app.generate_mpi
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/generate_mpi_test.py $<TARGET_FILE:shardtrain>
                   ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/app_generate_mpi ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set_tests_properties(app.generate_mpi PROPERTIES LABELS "cpu;mpi" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
# `shardtrain generate --split layers` under mpirun against one rank, gpt2 and llama, at 2 ranks and at 3 (3 stages
# of 4 blocks: uneven). On GPUs (label gpu; exits 77, reported as skipped, with fewer than 2): one GPU against 2 split
# ranks, and the split that --split auto chooses under a memory cap; stdlib-only Python, any python3 will do.
set(generate_split_gpt2 ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
set(generate_split_llama ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini)
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  foreach(family gpt2 llama)
    foreach(np 2 3)
      add_test(NAME app.generate_split.${family}.np${np}
               COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/generate_split_test.py $<TARGET_FILE:shardtrain>
                       ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/app_generate_split_${family}_${np}
                       ${generate_split_${family}} ${np})
      set_tests_properties(app.generate_split.${family}.np${np} PROPERTIES LABELS "cpu;mpi" TIMEOUT 300 PROCESSORS 2
                           ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
    endforeach()
  endforeach()
endif()
find_program(ANY_PYTHON3 NAMES python3)
if(SHARDTRAIN_HAVE_CUDA AND ANY_PYTHON3 AND MPIRUN_EXECUTABLE)
  foreach(family gpt2 llama)
    add_test(NAME gpu.generate_split.${family}
             COMMAND ${ANY_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/app/generate_split_test.py $<TARGET_FILE:shardtrain>
                     ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/gpu_generate_split_${family} ${generate_split_${family}} 2
                     --cuda $<TARGET_FILE:gpu_count>)
    set_tests_properties(gpu.generate_split.${family} PROPERTIES LABELS "gpu;mpi" TIMEOUT 900 SKIP_RETURN_CODE 77
                         RUN_SERIAL ON ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endforeach()
endif()
