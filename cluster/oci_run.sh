#!/usr/bin/env bash
# oci.conf's RunTimeRun for the local cluster: `exec cluster/oci_run.sh %b %n %t %n.%u.%j.%s.%t`.
#
# Slurm 22.05 starts a container step's task with only the step's SLURM_* variables:
# SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID and SLURMD_NODENAME are absent, and submitit (and
# torch.distributed through it) cannot tell which rank it is. This wrapper runs on the host,
# in the step's place: it adds them to the generated bundle's config.json from the node's name
# (%n), the task's index on its node (%t) and the step's node list, then execs crun, so that the
# runtime (not a shell) receives Slurm's signals. 22.05 runs one task per node in a container
# step: global rank = the node's index in the step's node list x 1 + %t.
# The batch step's own values of these arrive too (srun passes its environment on: rank 0 of
# node 0 on every node), so they are replaced. SQ_HOST_MNTNS names the host's mount namespace
# (the batch shell's, when it exported it), for the ranks to record beside their own.
set -euo pipefail
BUNDLE="$1" NODE="$2" TASK="$3" ID="$4"
ROOT="$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")"
STATE="${SQ_CRUN_ROOT:-/run/crun-sq}"
export BUNDLE NODE TASK
HOST_MNTNS="$(readlink /proc/self/ns/mnt)" /usr/bin/python3 - <<'PY'
import json, os, subprocess
path = os.path.join(os.environ["BUNDLE"], "config.json")
with open(path) as f:
    spec = json.load(f)
proc = spec.setdefault("process", {})
env = dict(e.split("=", 1) for e in proc.get("env", []) if "=" in e)
node, task = os.environ["NODE"], int(os.environ["TASK"])
nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or node
out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
nodes = out.stdout.split() or [node]
index = nodes.index(node) if node in nodes else 0
per_node = int(env.get("SLURM_STEP_TASKS_PER_NODE", "1").split("(")[0] or 1)
extra = {
    "SLURMD_NODENAME": node,
    "SLURM_NODEID": str(index),
    "SLURM_LOCALID": str(task),
    "SLURM_PROCID": str(index * per_node + task),
}
env.update(extra)  # over the batch step's own values, which srun passes on (rank 0 on node 0)
env.setdefault("SQ_HOST_MNTNS", os.environ["HOST_MNTNS"])  # the batch shell's, when it said it
proc["env"] = [f"{k}={v}" for k, v in env.items()]
spec.get("linux", {}).pop("cgroupsPath", None)
spec.pop("hostname", None)  # no UTS namespace: the node keeps the host's name
with open(path + ".tmp", "w") as f:
    json.dump(spec, f)
os.replace(path + ".tmp", path)
PY
mkdir -p "$STATE"
exec crun --cgroup-manager=disabled --root="$STATE" run --bundle "$BUNDLE" "$ID"
