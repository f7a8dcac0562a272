"""What a save killed part way must leave in ckpt.dir: no commit of its step, its temporary directory, and the
previous save committed. Standard library only (the GPU tests run under whichever python3 the machine has)."""
import os


def killed_save_failures(ckpt_dir, killed_step, previous_step):
    """The ways ckpt_dir differs from what a save of killed_step, killed before its commit, leaves behind."""
    names = sorted(os.listdir(ckpt_dir))
    failures = []
    if os.path.exists(os.path.join(ckpt_dir, f"step_{killed_step:08d}", "manifest.json")):
        failures.append(f"step {killed_step} was committed although its save was killed")
    if not any(n.startswith(f"step_{killed_step:08d}.tmp-") for n in names):
        failures.append(f"no uncommitted step {killed_step} directory left behind: {names}")
    if not os.path.exists(os.path.join(ckpt_dir, f"step_{previous_step:08d}", "manifest.json")):
        failures.append(f"step {previous_step} is not committed: {names}")
    return failures


def leftover_failures(ckpt_dir):
    """Uncommitted directories still in ckpt_dir (a resumed run removes them)."""
    left = sorted(n for n in os.listdir(ckpt_dir) if ".tmp-" in n)
    return [f"uncommitted directories survived the rerun: {left}"] if left else []
