// The npm packages the k8s checks need (package.json, pinned by package-lock.json) are installed by
// `npm ci --prefix k8s/validate`, a set-up step of README command 1 and of .ci/run. Without them the
// checks must fail loudly, never pass by checking nothing: require() this module before any package.
'use strict';
const fs = require('fs');
const path = require('path');

const modules = path.join(__dirname, 'node_modules');
if (!fs.existsSync(path.join(modules, 'kubernetes-models')) || !fs.existsSync(path.join(modules, 'ajv')) ||
    !fs.existsSync(path.join(modules, 'yaml'))) {
  console.error(`k8s checks: ${modules} is missing or incomplete: run \`npm ci --prefix k8s/validate\` ` +
                '(the set-up step in README command 1 and .ci/run) and rerun the tests');
  process.exit(3);
}
