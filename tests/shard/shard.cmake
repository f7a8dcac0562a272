# N MPI ranks against one process: ctest runs mpirun -np N for N = 1..4 on the tiny model and on a
# 2-layer GPT-2-shaped model (N = 3 gives uneven spans). Open MPI's run-as-root variables are set here,
# by the harness, not taken from the user's environment; OMP_NUM_THREADS=1 keeps 4 ranks on 2 cores sane.
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  foreach(n 1 2 3 4)
    add_test(NAME mpi.equivalence.tiny.np${n}
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/shard/mpi_equivalence_test.py $<TARGET_FILE:shardtrain>
                     ${MPIRUN_EXECUTABLE} ${n} ${CMAKE_BINARY_DIR}/mpi_equiv_tiny_${n} ${CMAKE_SOURCE_DIR}/configs/tiny.ini
                     --train.steps=30 --train.global_batch=12 --train.micro_batch=1 --model.seq_len=64
                     --optim.lr=1e-3 --optim.eps=1e-6)
    add_test(NAME mpi.equivalence.gpt2_shaped.np${n}
             COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/shard/mpi_equivalence_test.py $<TARGET_FILE:shardtrain>
                     ${MPIRUN_EXECUTABLE} ${n} ${CMAKE_BINARY_DIR}/mpi_equiv_gpt2_${n} @gpt2-shaped
                     --train.steps=30 --train.global_batch=12 --train.micro_batch=1 --optim.warmup_steps=5
                     --optim.eps=1e-6)
    set_tests_properties(mpi.equivalence.tiny.np${n} mpi.equivalence.gpt2_shaped.np${n} PROPERTIES
                         LABELS "cpu;mpi" TIMEOUT 600 PROCESSORS 2
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
  endforeach()
endif()

# The cpu backend's offloaded optimizer (host AdamW threads, one CPU share per local rank) under MPI: 2 ranks
# with optim.offload=optimizer train what one process does (the single process offloads too; that offloading
# changes no bit is StepEngine.OffloadedOptimizerGivesIdenticalWeights).
if(SYSTEM_PYTHON3 AND MPIRUN_EXECUTABLE)
  add_test(NAME mpi.equivalence.tiny.np2.offload
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/shard/mpi_equivalence_test.py $<TARGET_FILE:shardtrain>
                   ${MPIRUN_EXECUTABLE} 2 ${CMAKE_BINARY_DIR}/mpi_equiv_tiny_offload ${CMAKE_SOURCE_DIR}/configs/tiny.ini
                   --train.steps=20 --train.global_batch=12 --train.micro_batch=1 --model.seq_len=64
                   --optim.lr=1e-3 --optim.eps=1e-6 --optim.offload=optimizer)
  set_tests_properties(mpi.equivalence.tiny.np2.offload PROPERTIES LABELS "cpu;mpi" TIMEOUT 600 PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()

# A global batch that does not divide over 2 ranks: every rank reports it, the job exits with the
# bad-input code (2), and the message shows all three numbers.
if(MPIRUN_EXECUTABLE)
  add_test(NAME mpi.shardtrain.batch_does_not_divide
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh 2
                   "train.global_batch \\(3\\) must be a multiple of train.micro_batch \\(1\\) x world size \\(2\\)" --
                   ${MPIRUN_EXECUTABLE} --oversubscribe --mca btl self,vader -np 2 $<TARGET_FILE:shardtrain> train
                   --train.global_batch=3 --train.micro_batch=1)
  set_tests_properties(mpi.shardtrain.batch_does_not_divide PROPERTIES LABELS "cpu;mpi" TIMEOUT 60
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()

# ZeRO-3 on GPUs, as processes: 1 vs 2 GPUs (fp32 and bf16) and checkpoints across GPU/CPU world sizes.
# Label gpu; the script exits 77 (reported as skipped) with fewer than 2 GPUs. Stdlib-only Python, so
# whichever python3 the GPU machine has will do.
find_program(ANY_PYTHON3 NAMES python3)
if(SHARDTRAIN_HAVE_CUDA AND ANY_PYTHON3 AND MPIRUN_EXECUTABLE)
  foreach(case equivalence-fp32 equivalence-bf16 checkpoint fp16-overflow memory-cap offload)
    add_test(NAME gpu.zero3.${case}
             COMMAND ${ANY_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/shard/gpu_zero3_test.py ${case} $<TARGET_FILE:shardtrain>
                     $<TARGET_FILE:gpu_count> ${MPIRUN_EXECUTABLE} ${CMAKE_BINARY_DIR}/gpu_zero3_${case}
                     ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
    set_tests_properties(gpu.zero3.${case} PROPERTIES LABELS "gpu;mpi" TIMEOUT 900 SKIP_RETURN_CODE 77 RUN_SERIAL ON
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endforeach()
endif()
