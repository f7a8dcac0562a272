// Loading of Kubernetes manifests (multi-document YAML files) into plain objects, and the test mutations
// that derive a broken manifest from a real one (so a negative test cannot drift from the file it breaks).
//
//   const docs = loadFile('k8s/indexed-job.yaml');      // [{file, index, obj}], one per YAML document
//   mutate(docs, 'set', 'Job:spec.parallelism="2"');     // KIND:PATH=JSON on every document of that kind
//   mutate(docs, 'delete', 'Job:spec.podFailurePolicy.rules[0]');
'use strict';
require('./deps');
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

// Every document of FILE, in order. A YAML syntax error or an empty document is an error naming the file.
function loadFile(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'), {prettyErrors: true});
  return docs.map((doc, index) => {
    if (doc.errors.length) throw new Error(`${file}: document ${index + 1}: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (obj === null || typeof obj !== 'object') throw new Error(`${file}: document ${index + 1} is empty`);
    return {file, index, obj};
  });
}

// The *.yaml files directly in DIR, sorted.
function yamlFilesIn(dir) {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.yaml') || f.endsWith('.yml')).sort()
      .map((f) => path.join(dir, f));
}

// 'spec.rules[0].x' -> ['spec', 'rules', 0, 'x']
function parsePath(text) {
  const keys = [];
  for (const part of text.split('.')) {
    const m = /^([^[\]]*)((\[\d+\])*)$/.exec(part);
    if (!m) throw new Error(`bad path component '${part}' in '${text}'`);
    if (m[1]) keys.push(m[1]);
    for (const idx of m[2].match(/\d+/g) || []) keys.push(Number(idx));
  }
  return keys;
}

// Applies one mutation, OP 'set' (SPEC = KIND:PATH=JSON) or 'delete' (SPEC = KIND:PATH; an array element
// is spliced out), to every document whose kind is KIND. It is an error if none matches or a path is absent.
function mutate(docs, op, spec) {
  const m = op === 'set' ? /^(\w+):([^=]+)=(.*)$/s.exec(spec) : /^(\w+):(.+)$/.exec(spec);
  if (!m) throw new Error(`--${op} ${spec}: expected KIND:PATH${op === 'set' ? '=JSON' : ''}`);
  const [, kind, pathText, json] = m;
  const keys = parsePath(pathText);
  const targets = docs.filter((d) => d.obj.kind === kind);
  if (!targets.length) throw new Error(`--${op} ${spec}: no document of kind ${kind}`);
  for (const d of targets) {
    let parent = d.obj;
    for (const k of keys.slice(0, -1)) {
      if (parent[k] === undefined || parent[k] === null) throw new Error(`--${op} ${spec}: ${d.file} has no '${k}'`);
      parent = parent[k];
    }
    const last = keys[keys.length - 1];
    if (op === 'set') {
      parent[last] = JSON.parse(json);
    } else if (!(last in parent)) {
      throw new Error(`--${op} ${spec}: ${d.file} has no '${last}'`);
    } else if (Array.isArray(parent)) {
      parent.splice(last, 1);
    } else {
      delete parent[last];
    }
  }
}

// Parses the shared command line of the checks: [--set SPEC]... [--delete SPEC]... PATH... where a PATH
// that is a directory stands for its *.yaml files. Returns the loaded, mutated documents and the files.
function loadFromArgs(argv) {
  const mutations = [];
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--set' || argv[i] === '--delete') {
      mutations.push([argv[i].slice(2), argv[++i]]);
    } else if (argv[i].startsWith('--')) {
      throw new Error(`unknown option ${argv[i]}`);
    } else if (fs.statSync(argv[i]).isDirectory()) {
      files.push(...yamlFilesIn(argv[i]));
    } else {
      files.push(argv[i]);
    }
  }
  if (!files.length) throw new Error('no manifest given');
  const docs = files.flatMap(loadFile);
  for (const [op, spec] of mutations) mutate(docs, op, spec);
  return {files, docs};
}

module.exports = {loadFile, yamlFilesIn, mutate, loadFromArgs};
