// What a batch/v1 Job's podFailurePolicy does with one failed pod, following the Job API's rules (Kubernetes
// docs, "Pod failure policy"; batch/v1 PodFailurePolicyRule):
//   * rules are evaluated in order, and the first rule that matches decides the action;
//   * onExitCodes matches when at least one container (only the one named by containerName, if given) that
//     terminated with a non-zero exit code has its code In (or NotIn) the values; exit code 0 never matches;
//   * onPodConditions matches when the pod has a condition of one of the listed types with the listed status
//     (status defaults to "True");
//   * no matching rule: the failure is counted against backoffLimit, as with action Count.
//
//   actionFor(job.spec.podFailurePolicy, {exitCodes: {trainer: 2}})                              // 'FailJob'
//   actionFor(policy, {exitCodes: {trainer: 76}, conditions: [{type: 'DisruptionTarget', status: 'True'}]})
'use strict';

function exitCodesMatch(req, exitCodes) {
  return Object.entries(exitCodes).some(([name, code]) => {
    if (code === 0) return false;
    if (req.containerName && req.containerName !== name) return false;
    const listed = req.values.includes(code);
    return req.operator === 'In' ? listed : req.operator === 'NotIn' ? !listed : false;
  });
}

function conditionsMatch(patterns, conditions) {
  return patterns.some((p) => conditions.some((c) => c.type === p.type && c.status === (p.status || 'True')));
}

// POLICY: a Job's spec.podFailurePolicy (or undefined). POD: {exitCodes: {containerName: code}, conditions: [...]}.
// Returns 'FailJob', 'FailIndex', 'Ignore' or 'Count'.
function actionFor(policy, pod) {
  for (const rule of (policy && policy.rules) || []) {
    const byCode = rule.onExitCodes && exitCodesMatch(rule.onExitCodes, pod.exitCodes || {});
    const byCondition = rule.onPodConditions && conditionsMatch(rule.onPodConditions, pod.conditions || []);
    if (byCode || byCondition) return rule.action;
  }
  return 'Count';
}

module.exports = {actionFor};
