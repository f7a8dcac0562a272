#!/usr/bin/env node
// Checks the facts the Kubernetes manifests must keep, beyond the API schema (which schema_check.js checks):
// the failure policy, the grace period, and that GPUs, ranks, slots, DNS names and volumes agree.
//
//   node k8s/validate/policy_check.js [--shardtrain BUILD/shardtrain] k8s
//   node k8s/validate/policy_check.js --delete 'Job:spec.podFailurePolicy.rules[0]' k8s   # must fail
//
// With --shardtrain, every --section.key=value in a command must be a key `shardtrain --help` lists.
// Prints one line per fact; exit 1 if any fails, 2 on a usage error.
'use strict';
const {loadFromArgs} = require('./manifests');
const {actionFor} = require('./pod_failure_policy');
const {execFileSync} = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

// The grace period must cover the step in flight at SIGTERM plus one checkpoint save. The largest shipped model
// (configs/gpt2-2.7b.ini) checkpoints 2.7e9 parameters x 12 bytes (fp32 master, AdamW m and v) = 32.4 GB; over
// 1 GbE NFS (~110 MB/s) that is ~295 s. One of its optimizer steps on two RTX 4090s is taken as at most 120 s.
const CKPT_SAVE_BOUND_S = 300;
const STEP_BOUND_S = 120;
// The Job controller delays a replacement pod by up to 6 minutes after repeated failures; the ranks that are
// already up must wait longer than that at the rendezvous.
const REPLACEMENT_DELAY_CAP_S = 360;
const REPO = path.join(__dirname, '..', '..');

const results = [];
function fact(text, holds, detail = '') {
  results.push(holds);
  console.log(holds ? `ok   ${text}` : `FAIL ${text}${detail ? `: ${detail}` : ''}`);
}

// The value of --key=value or --key value in ARGS, or undefined.
function argValue(args, key) {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === key) return args[i + 1];
    if (args[i].startsWith(`${key}=`)) return args[i].slice(key.length + 1);
  }
  return undefined;
}
function envValue(container, name) {
  const e = (container.env || []).find((v) => v.name === name);
  return e && e.value;
}
function gpuLimit(container) {
  return Number(((container.resources || {}).limits || {})['nvidia.com/gpu']);
}
function commandOf(container) {
  return [...(container.command || []), ...(container.args || [])].map(String);
}
function volumeFor(podSpec, container, mountPath) {
  const m = (container.volumeMounts || []).find((v) => v.mountPath === mountPath);
  return m && {mount: m, volume: (podSpec.volumes || []).find((v) => v.name === m.name)};
}

function knownConfigKeys(shardtrain) {
  const help = execFileSync(shardtrain, ['--help'], {encoding: 'utf8'});
  const keys = [...help.matchAll(/^\s+([a-z_]+\.[a-z0-9_]+)\s+\(default/gm)].map((m) => m[1]);
  if (keys.length < 20) throw new Error(`${shardtrain} --help listed only ${keys.length} config keys`);
  return new Set(keys);
}

// Facts shared by both launch styles, for the pod that runs the trainers.
function checkTrainerPod(what, podSpec, container, trainerArgs, docs, configKeys) {
  const grace = podSpec.terminationGracePeriodSeconds;
  fact(`${what}: terminationGracePeriodSeconds (${grace}) > step (${STEP_BOUND_S} s) + checkpoint save ` +
       `(${CKPT_SAVE_BOUND_S} s)`, grace > STEP_BOUND_S + CKPT_SAVE_BOUND_S);
  const shm = volumeFor(podSpec, container, '/dev/shm');
  fact(`${what}: /dev/shm is a memory-backed emptyDir`,
       !!(shm && shm.volume && shm.volume.emptyDir && shm.volume.emptyDir.medium === 'Memory'));
  fact(`${what}: --ckpt.resume=auto`, argValue(trainerArgs, '--ckpt.resume') === 'auto');
  const ckptDir = argValue(trainerArgs, '--ckpt.dir') || '';
  const mount = (container.volumeMounts || []).find((m) => ckptDir.startsWith(`${m.mountPath}/`));
  const volume = mount && (podSpec.volumes || []).find((v) => v.name === mount.name);
  const claim = volume && volume.persistentVolumeClaim && volume.persistentVolumeClaim.claimName;
  const pvc = docs.find((d) => d.kind === 'PersistentVolumeClaim' && d.metadata.name === claim);
  fact(`${what}: ckpt.dir (${ckptDir}) is on a writable mount of a ReadWriteMany claim defined in k8s/ (${claim})`,
       !!(pvc && !mount.readOnly && pvc.spec.accessModes.includes('ReadWriteMany')));
  if (configKeys) {
    const unknown = trainerArgs.filter((a) => /^--[a-z_]+\.[a-z0-9_]+/.test(a))
        .map((a) => a.slice(2).split('=')[0]).filter((k) => !configKeys.has(k));
    fact(`${what}: every --section.key is a shardtrain config key`, unknown.length === 0, unknown.join(', '));
  }
}

function checkIndexedJob(job, docs, configKeys) {
  const what = `Job ${job.metadata.name}`;
  const spec = job.spec;
  const pod = spec.template.spec;
  const trainer = pod.containers.find((c) => c.name === 'trainer') || pod.containers[0];
  const policy = spec.podFailurePolicy;
  const name = trainer.name;
  fact(`${what}: restartPolicy Never (podFailurePolicy requires it)`, pod.restartPolicy === 'Never');
  const cases = [
    ['exit 2 (bad input) fails the Job', {exitCodes: {[name]: 2}}, 'FailJob'],
    ['exit 1 (internal error) fails the Job', {exitCodes: {[name]: 1}}, 'FailJob'],
    ['exit 75 (fault) is retried and counted', {exitCodes: {[name]: 75}}, 'Count'],
    ['exit 76 (stopped by a signal) is retried and counted', {exitCodes: {[name]: 76}}, 'Count'],
    ['a disruption (DisruptionTarget) after exit 76 is ignored',
     {exitCodes: {[name]: 76}, conditions: [{type: 'DisruptionTarget', status: 'True'}]}, 'Ignore'],
    ['a disruption killed at the grace period (137) is ignored',
     {exitCodes: {[name]: 137}, conditions: [{type: 'DisruptionTarget', status: 'True'}]}, 'Ignore'],
  ];
  for (const [text, failedPod, want] of cases) {
    const got = actionFor(policy, failedPod);
    fact(`${what}: ${text}`, got === want, `podFailurePolicy gives ${got}, expected ${want}`);
  }
  // The API server's own checks of onExitCodes, which the OpenAPI schema does not express.
  const reqs = ((policy && policy.rules) || []).map((r) => r.onExitCodes).filter(Boolean);
  const names = new Set([...pod.containers, ...(pod.initContainers || [])].map((c) => c.name));
  fact(`${what}: every onExitCodes.containerName names a container of the pod`,
       reqs.every((r) => !r.containerName || names.has(r.containerName)));
  fact(`${what}: onExitCodes values are ascending, unique and non-zero`,
       reqs.every((r) => r.values.every((v, i) => v !== 0 && (i === 0 || v > r.values[i - 1]))));
  fact(`${what}: completionMode Indexed, completions = parallelism`,
       spec.completionMode === 'Indexed' && spec.completions === spec.parallelism);
  fact(`${what}: backoffLimit (${spec.backoffLimit}) >= parallelism (one fault fails every pod)`,
       spec.backoffLimit >= spec.parallelism);
  const service = docs.find((d) => d.kind === 'Service' && d.metadata.name === pod.subdomain);
  const selector = (service && service.spec.selector) || {};
  fact(`${what}: subdomain names a headless Service that selects the Job's pods`,
       !!service && service.spec.clusterIP === 'None' &&
       (selector['batch.kubernetes.io/job-name'] || selector['job-name']) === job.metadata.name);
  const local = Number(envValue(trainer, 'LOCAL_WORLD_SIZE'));
  fact(`${what}: LOCAL_WORLD_SIZE (${local}) = nvidia.com/gpu (${gpuLimit(trainer)})`, local === gpuLimit(trainer));
  const world = Number(envValue(trainer, 'WORLD_SIZE'));
  fact(`${what}: WORLD_SIZE (${world}) = parallelism x LOCAL_WORLD_SIZE`, world === spec.parallelism * local);
  const master = `${job.metadata.name}-0.${pod.subdomain}`;
  fact(`${what}: MASTER_ADDR is pod 0's DNS name (${master})`, envValue(trainer, 'MASTER_ADDR') === master);
  const cmd = commandOf(trainer);
  const sep = cmd.indexOf('--');
  fact(`${what}: runs launch/pod_launch.sh -- shardtrain`,
       sep === 1 && cmd[0].endsWith('/launch/pod_launch.sh') && /shardtrain$/.test(cmd[2] || ''));
  const trainerArgs = cmd.slice(sep + 1);
  fact(`${what}: --dist.bootstrap=env`, argValue(trainerArgs, '--dist.bootstrap') === 'env');
  const rdv = Number(argValue(trainerArgs, '--dist.rendezvous_timeout_s'));
  fact(`${what}: dist.rendezvous_timeout_s (${rdv}) > the replacement delay cap (${REPLACEMENT_DELAY_CAP_S} s)`,
       rdv > REPLACEMENT_DELAY_CAP_S);
  checkTrainerPod(what, pod, trainer, trainerArgs, docs, configKeys);
}

function checkMpiJob(job, docs, configKeys) {
  const what = `MPIJob ${job.metadata.name}`;
  const {Launcher: launcher, Worker: worker} = job.spec.mpiReplicaSpecs;
  const workerPod = worker.template.spec;
  const workerContainer = workerPod.containers[0];
  const slots = job.spec.slotsPerWorker;
  fact(`${what}: slotsPerWorker (${slots}) = the worker's nvidia.com/gpu (${gpuLimit(workerContainer)})`,
       slots === gpuLimit(workerContainer));
  const launcherContainer = launcher.template.spec.containers[0];
  const cmd = commandOf(launcherContainer);
  const sep = cmd.indexOf('--');
  const launchArgs = cmd.slice(1, sep);
  fact(`${what}: the launcher runs launch/mpirun.sh --gpus-per-host = slotsPerWorker`,
       cmd[0].endsWith('/launch/mpirun.sh') && Number(argValue(launchArgs, '--gpus-per-host')) === slots);
  // The line mpirun.sh builds from these arguments, against a hostfile written as the operator writes it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardtrain-k8s-'));
  const hostfile = path.join(dir, 'hostfile');
  fs.writeFileSync(hostfile, Array.from({length: worker.replicas},
      (_, i) => `${job.metadata.name}-worker-${i}.${job.metadata.name}.default.svc slots=${slots}\n`).join(''));
  const args = launchArgs.map((a) => (a === argValue(launchArgs, '--hostfile') ? hostfile : a));
  const launcherEnv = Object.fromEntries((launcherContainer.env || []).map((e) => [e.name, e.value]));
  let line = '';
  try {
    line = execFileSync('bash', [path.join(REPO, 'launch', 'mpirun.sh'), '--dry-run', ...args, '--', ...cmd.slice(sep + 1)],
                        {encoding: 'utf8', env: {PATH: process.env.PATH, ...launcherEnv}});
  } catch (err) {
    line = `${err.stdout || ''}${err.stderr || ''}`;
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
  const np = worker.replicas * slots;
  fact(`${what}: mpirun.sh starts -np ${np} (workers x slots), ${slots} per node, --bind-to none`,
       line.includes(` -np ${np} --map-by ppr:${slots}:node --bind-to none `), line.trim());
  // Ranks start through ssh and see only what mpirun forwards; OMPI_ALLOW_* are for mpirun itself.
  const unforwarded = Object.keys(launcherEnv).filter((n) => !n.startsWith('OMPI_ALLOW_') && !line.includes(` -x ${n} `));
  fact(`${what}: mpirun.sh forwards the launcher's environment to the ranks (-x)`, unforwarded.length === 0,
       `not forwarded: ${unforwarded.join(', ')}`);
  fact(`${what}: the launcher retries (runPolicy.backoffLimit >= 1)`, job.spec.runPolicy.backoffLimit >= 1);
  checkTrainerPod(`${what} worker`, workerPod, workerContainer, cmd.slice(sep + 1), docs, configKeys);
}

function main() {
  const argv = process.argv.slice(2);
  let configKeys = null;
  let loaded;
  try {
    const i = argv.indexOf('--shardtrain');
    if (i >= 0) configKeys = knownConfigKeys(argv.splice(i, 2)[1]);
    loaded = loadFromArgs(argv);
  } catch (err) {
    console.error(`policy_check: ${err.message}`);
    return 2;
  }
  const docs = loaded.docs.map((d) => d.obj);
  const jobs = docs.filter((d) => d.kind === 'Job');
  const mpiJobs = docs.filter((d) => d.kind === 'MPIJob');
  fact('the manifests hold an Indexed Job and an MPIJob', jobs.length >= 1 && mpiJobs.length >= 1);
  for (const job of jobs) checkIndexedJob(job, docs, configKeys);
  for (const job of mpiJobs) checkMpiJob(job, docs, configKeys);
  const failed = results.filter((ok) => !ok).length;
  console.log(`k8s policy: ${results.length - failed} of ${results.length} facts hold`);
  return failed ? 1 : 0;
}

process.exitCode = main();
