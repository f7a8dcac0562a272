# Tests that are not GoogleTest binaries: PyTorch parity and end-to-end runs of the shardtrain binary.
# Included from the top-level CMakeLists.txt when SHARDTRAIN_TESTS is on.

find_program(SYSTEM_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)

if(SYSTEM_PYTHON3)
  # The tiny byte-level model, with gradient accumulation (global_batch = 2 x micro_batch).
  add_test(NAME parity.torch.tiny
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/parity_test.py $<TARGET_FILE:parity_dump>
                   ${CMAKE_SOURCE_DIR}/configs/tiny.ini ${CMAKE_BINARY_DIR}/parity_tiny
                   --train.micro_batch=2 --train.global_batch=4 --optim.warmup_steps=2 --train.steps=10
                   --optim.lr=3e-3 --optim.eps=1e-6)
  # A 2-layer GPT-2-shaped model: vocab 50257 padded to 50304, C=768, 12 heads.
  add_test(NAME parity.torch.gpt2_2layer
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/parity_test.py $<TARGET_FILE:parity_dump>
                   ${CMAKE_SOURCE_DIR}/configs/gpt2-124m.ini ${CMAKE_BINARY_DIR}/parity_gpt2
                   --model.n_layer=2 --model.seq_len=64 --train.micro_batch=2 --train.global_batch=2
                   --optim.warmup_steps=2 --train.steps=10 --optim.lr=1e-3 --optim.eps=1e-6)
  set_tests_properties(parity.torch.tiny parity.torch.gpt2_2layer PROPERTIES LABELS "cpu;parity;numeric" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT OMP_NUM_THREADS=1)

  # NF4 (QLoRA's 4-bit base weights) against an independent NumPy quantiser: identical codes, scales and values.
  add_test(NAME nf4.numpy_reference
           COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/kernels/nf4_test.py $<TARGET_FILE:nf4_codes>
                   ${CMAKE_BINARY_DIR}/nf4_test)
  set_tests_properties(nf4.numpy_reference PROPERTIES LABELS "cpu;numeric" TIMEOUT 300)

  # parity_case(NAME NP SCRIPT ARGS...): tests/model/SCRIPT ARGS at NP ranks (NP > 1 under mpirun, where there is one).
  find_program(PARITY_MPIRUN NAMES mpirun mpiexec)
  function(parity_case name np script)
    if(np EQUAL 1)
      set(launch)
    elseif(PARITY_MPIRUN)
      set(launch --mpirun ${PARITY_MPIRUN} --np ${np})
    else()
      return()
    endif()
    add_test(NAME ${name} COMMAND ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/${script} ${launch} ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS "cpu;parity;numeric" TIMEOUT 300 PROCESSORS 2
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
  endfunction()
  set(parity_batches --model.seq_len=64 --train.micro_batch=2 --train.global_batch=12 --optim.warmup_steps=2
                     --train.steps=10 --optim.lr=1e-3 --optim.eps=1e-6)

  # The llama family against Hugging Face's Llama written out in torch, at 1 and 3 ranks (3: uneven spans), in two
  # shapes: grouped-query attention (4 query heads on 2 K/V heads) with llama3 RoPE scaling and a tied head; and
  # q/k/v biases (Qwen 2.5) with an untied head.
  set(llama_gqa --model.rope_theta=500000 --model.rope_scaling=llama3 --model.rope_scaling_factor=8
                --model.rope_scaling_original_max_position=64)
  set(llama_bias --model.n_kv_head=4 --model.qkv_bias=true --model.tie_embeddings=false)
  foreach(shape gqa bias)
    foreach(np 1 3)
      parity_case(parity.torch.llama_${shape}.np${np} ${np} parity_test.py $<TARGET_FILE:parity_dump>
                  ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini ${CMAKE_BINARY_DIR}/parity_llama_${shape}_${np}
                  ${llama_${shape}} ${parity_batches})
    endforeach()
  endforeach()

  # Loss masks against PyTorch's ignore_index mean over the whole global batch: a random mask with one rank's whole
  # micro-batch masked, gradient accumulation at both rank counts (np1: 6 micro-steps, np3: 2).
  set(masked_gpt2_config ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set(masked_gpt2_args)
  set(masked_llama_config ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini)
  set(masked_llama_args ${llama_gqa})
  foreach(family gpt2 llama)
    foreach(np 1 3)
      parity_case(parity.torch.masked_${family}.np${np} ${np} parity_test.py --mask $<TARGET_FILE:parity_dump>
                  ${masked_${family}_config} ${CMAKE_BINARY_DIR}/parity_masked_${family}_${np} ${masked_${family}_args}
                  ${parity_batches})
    endforeach()
  endforeach()

  # LoRA against a PyTorch LoRA on the same frozen base, at 1 and 3 ranks, with ranks, alphas and target sets that
  # are not the defaults: gpt2 with rsLoRA on two of its four layers; llama with grouped-query attention on q, k, v
  # (row slices of one stacked weight), gate and down; llama with q/k/v biases and an untied head on k, o and up;
  # the first two again with adapter dropout.
  set(lora_gpt2_config ${CMAKE_SOURCE_DIR}/configs/tiny.ini)
  set(lora_gpt2_args --lora.rank=2 --lora.alpha=3 --lora.rslora=true --lora.targets=qkv,fc_proj)
  set(lora_llama_gqa_config ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini)
  set(lora_llama_gqa_args ${llama_gqa} --lora.rank=3 --lora.alpha=5 --lora.targets=q,k,v,gate,down)
  set(lora_llama_bias_config ${CMAKE_SOURCE_DIR}/configs/tiny-llama.ini)
  set(lora_llama_bias_args ${llama_bias} --lora.rank=5 --lora.alpha=7 --lora.targets=k,o,up)
  # With adapter dropout, whose masks the test draws from kernels/lora.h's formula.
  set(lora_gpt2_dropout_config ${lora_gpt2_config})
  set(lora_gpt2_dropout_args ${lora_gpt2_args} --lora.dropout=0.1)
  set(lora_llama_dropout_config ${lora_llama_gqa_config})
  set(lora_llama_dropout_args ${lora_llama_gqa_args} --lora.dropout=0.25)
  foreach(shape gpt2 llama_gqa llama_bias gpt2_dropout llama_dropout)
    foreach(np 1 3)
      parity_case(parity.torch.lora_${shape}.np${np} ${np} lora_parity_test.py $<TARGET_FILE:parity_dump>
                  ${lora_${shape}_config} ${CMAKE_BINARY_DIR}/parity_lora_${shape}_${np} ${lora_${shape}_args}
                  ${parity_batches})
    endforeach()
  endforeach()
  # QLoRA: the first two on an NF4 base (lora.base_dtype = nf4), which the test quantises from the drawn weights with
  # its own NumPy NF4.
  foreach(shape gpt2 llama_gqa)
    foreach(np 1 3)
      parity_case(parity.torch.qlora_${shape}.np${np} ${np} lora_parity_test.py $<TARGET_FILE:parity_dump>
                  ${lora_${shape}_config} ${CMAKE_BINARY_DIR}/parity_qlora_${shape}_${np} ${lora_${shape}_args}
                  --lora.base_dtype=nf4 ${parity_batches})
    endforeach()
  endforeach()
endif()
# The llama family against Hugging Face transformers (on the GPU machine, whose python3 has it): import of
# save_pretrained directories, logits, bf16 loss, and train -> export -> from_pretrained. Skipped (exit 77) where
# transformers or a CUDA device is missing.
find_program(PATH_PYTHON3 NAMES python3)
if(PATH_PYTHON3 AND SHARDTRAIN_HAVE_CUDA)
  add_test(NAME gpu.transformers.llama
           COMMAND ${PATH_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/transformers_check.py $<TARGET_FILE:shardtrain>
                   $<TARGET_FILE:logits_dump> ${CMAKE_BINARY_DIR}/transformers_check)
  set_tests_properties(gpu.transformers.llama PROPERTIES LABELS "gpu" TIMEOUT 600 SKIP_RETURN_CODE 77)
  # LoRA against PEFT: the exported adapter and merged model load in transformers with shardtrain eval's loss, and
  # greedy generation agrees. Skipped (exit 77) where peft is missing.
  add_test(NAME gpu.peft.lora
           COMMAND ${PATH_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/peft_check.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/peft_check)
  add_test(NAME gpu.peft.lora_cuda
           COMMAND ${PATH_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/model/peft_check.py $<TARGET_FILE:shardtrain>
                   ${CMAKE_BINARY_DIR}/peft_check_cuda --train.device=cuda)
  set_tests_properties(gpu.peft.lora gpu.peft.lora_cuda PROPERTIES LABELS "gpu" TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
include(${CMAKE_SOURCE_DIR}/tests/shard/shard.cmake)
include(${CMAKE_SOURCE_DIR}/tests/comm/comm.cmake)
include(${CMAKE_SOURCE_DIR}/tests/comm/env_bootstrap.cmake)
include(${CMAKE_SOURCE_DIR}/tests/ckpt/ckpt.cmake)
include(${CMAKE_SOURCE_DIR}/tests/ckpt/tools.cmake)
include(${CMAKE_SOURCE_DIR}/tests/train/train.cmake)
include(${CMAKE_SOURCE_DIR}/tests/launch/launch.cmake)
include(${CMAKE_SOURCE_DIR}/tests/k8s/k8s.cmake)
include(${CMAKE_SOURCE_DIR}/tests/text/text.cmake)
include(${CMAKE_SOURCE_DIR}/tests/text/tokenize.cmake)
include(${CMAKE_SOURCE_DIR}/tests/app/app.cmake)
include(${CMAKE_SOURCE_DIR}/tests/bench/bench.cmake)
# The fault-injection suite's tests that are not GoogleTest binaries: one tests/faults/<topic>.cmake each.
file(GLOB FAULT_TEST_CMAKES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/faults/*.cmake)
foreach(f ${FAULT_TEST_CMAKES})
  include(${f})
endforeach()
