# The Kubernetes manifests in k8s/, checked offline (no cluster): the API schema (k8s/validate/schema_check.js:
# kubernetes-models for core and batch kinds, k8s/schema/mpijob-v2beta1.schema.json through ajv for the MPIJob),
# the failure policy and the agreement of GPUs, ranks, slots, names and volumes (k8s/validate/policy_check.js),
# and broken variants of the real manifests (one mutation each) that must be rejected with the expected message.
# The npm packages come from `npm ci --prefix k8s/validate` (README command 1, .ci/run); without them every
# test here fails and says so.
find_program(NODE_EXECUTABLE NAMES node nodejs)
set(k8s_dir ${CMAKE_SOURCE_DIR}/k8s)
set(k8s_tools ${k8s_dir}/validate)
set(expect_exit sh ${CMAKE_SOURCE_DIR}/tests/comm/expect_exit.sh)
if(NOT NODE_EXECUTABLE)
  add_test(NAME k8s.node_missing
           COMMAND sh -c "echo 'node not found: apt-get install nodejs npm, then npm ci --prefix k8s/validate'; exit 1")
  set_tests_properties(k8s.node_missing PROPERTIES LABELS cpu)
  return()
endif()
set(schema_check ${NODE_EXECUTABLE} ${k8s_tools}/schema_check.js)
set(policy_check ${NODE_EXECUTABLE} ${k8s_tools}/policy_check.js --shardtrain $<TARGET_FILE:shardtrain>)

add_test(NAME k8s.schema COMMAND ${expect_exit} 0 "^k8s schema: 4 of 4 objects in 3 files valid$" --
         ${schema_check} ${k8s_dir})
add_test(NAME k8s.policy COMMAND ${expect_exit} 0 "^k8s policy: 34 of 34 facts hold$" -- ${policy_check} ${k8s_dir})

# Each: NAME, the expected line (grep -E), the check, then its mutation and files.
function(k8s_reject name regex)
  add_test(NAME k8s.reject.${name} COMMAND ${expect_exit} 1 "${regex}" -- ${ARGN})
  set(k8s_reject_tests ${k8s_reject_tests} k8s.reject.${name} PARENT_SCOPE)
endfunction()
k8s_reject(parallelism_string "^  /spec/parallelism must be integer$"
           ${schema_check} --set "Job:spec.parallelism=\"2\"" ${k8s_dir}/indexed-job.yaml)
k8s_reject(unknown_kind "no schema for apiVersion v1, kind Foo"
           ${schema_check} --set "PersistentVolumeClaim:kind=\"Foo\"" ${k8s_dir}/checkpoint-pvc.yaml)
k8s_reject(mpijob_unknown_field "^  /spec must NOT have additional properties 'slotsPerNode'$"
           ${schema_check} --set "MPIJob:spec.slotsPerNode=2" ${k8s_dir}/mpijob.yaml)
k8s_reject(mpijob_bad_enum "^  /spec/runPolicy/cleanPodPolicy must be equal to one of the allowed values \\(None, Running, All\\)$"
           ${schema_check} --set "MPIJob:spec.runPolicy.cleanPodPolicy=\"Always\"" ${k8s_dir}/mpijob.yaml)
k8s_reject(mpijob_pod_template "^  /spec/mpiReplicaSpecs/Worker/template/spec/terminationGracePeriodSeconds must be integer$"
           ${schema_check} --set "MPIJob:spec.mpiReplicaSpecs.Worker.template.spec.terminationGracePeriodSeconds=\"600\""
           ${k8s_dir}/mpijob.yaml)
k8s_reject(no_exit2_rule "^FAIL Job shardtrain: exit 2 \\(bad input\\) fails the Job: podFailurePolicy gives Count, expected FailJob$"
           ${policy_check} --delete "Job:spec.podFailurePolicy.rules[0]" ${k8s_dir})
k8s_reject(disruption_counted "^FAIL Job shardtrain: a disruption \\(DisruptionTarget\\) after exit 76 is ignored: podFailurePolicy gives Count, expected Ignore$"
           ${policy_check} --set "Job:spec.podFailurePolicy.rules=[{\"action\":\"Count\",\"onExitCodes\":{\"containerName\":\"trainer\",\"operator\":\"In\",\"values\":[75,76]}},{\"action\":\"Ignore\",\"onPodConditions\":[{\"type\":\"DisruptionTarget\",\"status\":\"True\"}]},{\"action\":\"FailJob\",\"onExitCodes\":{\"operator\":\"In\",\"values\":[1,2]}}]"
           ${k8s_dir})
k8s_reject(exit_codes_unsorted "^FAIL Job shardtrain: onExitCodes values are ascending, unique and non-zero$"
           ${policy_check} --set "Job:spec.podFailurePolicy.rules[2].onExitCodes.values=[76,75]" ${k8s_dir})
k8s_reject(restart_on_failure "^FAIL Job shardtrain: restartPolicy Never"
           ${policy_check} --set "Job:spec.template.spec.restartPolicy=\"OnFailure\"" ${k8s_dir})
k8s_reject(short_grace "^FAIL Job shardtrain: terminationGracePeriodSeconds \\(60\\) > step"
           ${policy_check} --set "Job:spec.template.spec.terminationGracePeriodSeconds=60" ${k8s_dir})
k8s_reject(world_size "^FAIL Job shardtrain: WORLD_SIZE \\(4\\) = parallelism x LOCAL_WORLD_SIZE$"
           ${policy_check} --set "Job:spec.parallelism=3" --set "Job:spec.completions=3" ${k8s_dir})
k8s_reject(slots_vs_gpus "^FAIL MPIJob shardtrain-mpi: slotsPerWorker \\(1\\) = the worker's nvidia.com/gpu \\(2\\)$"
           ${policy_check} --set "MPIJob:spec.slotsPerWorker=1" ${k8s_dir})
k8s_reject(unknown_config_key "^FAIL Job shardtrain: every --section.key is a shardtrain config key: ckpt.dirr$"
           ${policy_check} --set "Job:spec.template.spec.containers[0].command[13]=\"--ckpt.dirr=/ckpt/x\"" ${k8s_dir})
# A key with a digit in its name (optim.beta1) is a config key like any other.
add_test(NAME k8s.accept.digit_in_key COMMAND ${expect_exit} 0 "^k8s policy: 34 of 34 facts hold$" --
         ${policy_check} --set "Job:spec.template.spec.containers[0].command[13]=\"--optim.beta1=0.85\"" ${k8s_dir})

# Without node_modules (here: the scripts copied where there is none) the checks fail and say what to run.
add_test(NAME k8s.missing_node_modules
         COMMAND ${expect_exit} 3 "node_modules is missing or incomplete: run .npm ci --prefix k8s/validate." --
                 sh -c "d=$(mktemp -d) && cp ${k8s_tools}/*.js \"$d\" && ${NODE_EXECUTABLE} \"$d/schema_check.js\" ${k8s_dir}; rc=$?; rm -rf \"$d\"; exit $rc")
set_tests_properties(k8s.schema k8s.policy k8s.accept.digit_in_key k8s.missing_node_modules ${k8s_reject_tests} PROPERTIES LABELS cpu TIMEOUT 60)
