#!/usr/bin/env node
// Validates Kubernetes manifests offline against the API schema, and exits 0 only if every object is valid.
//
//   node k8s/validate/schema_check.js k8s                  # every *.yaml in k8s/
//   node k8s/validate/schema_check.js --set 'Job:spec.parallelism="2"' k8s/indexed-job.yaml   # must fail
//
// Core and batch kinds: kubernetes-models (the Kubernetes OpenAPI schema compiled to validators; types,
// required fields, enums, formats; it does not reject unknown fields). The MPIJob (a CRD, absent from that
// schema): k8s/schema/mpijob-v2beta1.schema.json through ajv (strict: unknown fields are errors), and each
// replica's pod template as a core/v1 PodTemplateSpec through kubernetes-models.
// Prints one line per object and a summary; exit 1 on any invalid object, 2 on a usage or load error.
'use strict';
const {loadFromArgs} = require('./manifests');
const path = require('path');
const Ajv = require('ajv');
const models = {
  'v1/PersistentVolumeClaim': require('kubernetes-models/v1/PersistentVolumeClaim').PersistentVolumeClaim,
  'v1/Service': require('kubernetes-models/v1/Service').Service,
  'v1/ConfigMap': require('kubernetes-models/v1/ConfigMap').ConfigMap,
  'batch/v1/Job': require('kubernetes-models/batch/v1/Job').Job,
};
const {PodTemplateSpec} = require('kubernetes-models/v1/PodTemplateSpec');

const ajv = new Ajv({allErrors: true, strict: true});
const validateMpiJob = ajv.compile(require(path.join(__dirname, '..', 'schema', 'mpijob-v2beta1.schema.json')));

function ajvMessages(errors, prefix = '') {
  return errors.map((e) => {
    const extra = e.keyword === 'additionalProperties' ? ` '${e.params.additionalProperty}'` :
                  e.keyword === 'enum' ? ` (${e.params.allowedValues.join(', ')})` : '';
    return `${prefix}${e.instancePath || '/'} ${e.message}${extra}`;
  });
}

// kubernetes-models throws a ValidationError whose .errors are ajv errors.
function modelMessages(model, prefix = '') {
  try {
    model.validate();
    return [];
  } catch (err) {
    if (!Array.isArray(err.errors)) throw err;
    return ajvMessages(err.errors, prefix);
  }
}

// The list of problems with one object (empty: valid).
function check(obj) {
  const key = `${obj.apiVersion}/${obj.kind}`;
  if (key === 'kubeflow.org/v2beta1/MPIJob') {
    const problems = validateMpiJob(obj) ? [] : ajvMessages(validateMpiJob.errors);
    for (const [role, spec] of Object.entries((obj.spec && obj.spec.mpiReplicaSpecs) || {})) {
      if (spec && spec.template && typeof spec.template === 'object') {
        problems.push(...modelMessages(new PodTemplateSpec(spec.template), `/spec/mpiReplicaSpecs/${role}/template`));
      }
    }
    return problems;
  }
  const Model = models[key];
  if (!Model) return [`no schema for apiVersion ${obj.apiVersion}, kind ${obj.kind} (known: ${Object.keys(models).join(', ')}, kubeflow.org/v2beta1/MPIJob)`];
  return modelMessages(new Model(obj));
}

function main() {
  let loaded;
  try {
    loaded = loadFromArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`schema_check: ${err.message}`);
    return 2;
  }
  let bad = 0;
  for (const {file, index, obj} of loaded.docs) {
    const name = `${file}: ${obj.apiVersion} ${obj.kind} ${(obj.metadata && obj.metadata.name) || `(document ${index + 1})`}`;
    const problems = check(obj);
    if (problems.length) {
      bad++;
      console.log(`INVALID ${name}`);
      for (const p of problems) console.log(`  ${p}`);
    } else {
      console.log(`ok      ${name}`);
    }
  }
  const n = loaded.docs.length;
  console.log(`k8s schema: ${n - bad} of ${n} objects in ${loaded.files.length} files valid`);
  return bad ? 1 : 0;
}

process.exitCode = main();
