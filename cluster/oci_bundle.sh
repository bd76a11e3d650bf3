#!/usr/bin/env bash
# Build the local cluster's OCI bundle for `srun --container <bundle>` (Slurm's own OCI support,
# run by crun through .cluster/etc/oci.conf): a rootfs of empty mount points and a config.json
# that binds this host's directories into it, so that the job runs the project's venv inside a
# container without an image to download.
#
#   bash cluster/oci_bundle.sh BUNDLE [VENV]     (cluster.sh up calls it: .cluster/oci/bundle)
#
# What the container shares and what it does not (cluster/README.md, "The OCI bundle"):
# - only a mount and a pid namespace of its own: NCCL, gloo and the rendezvous need the host's
#   network, and ranks on one node share the host's real /dev/shm (bound in);
# - bound in: /dev (its real /dev/shm and, on a GPU node, /dev/nvidia*), /usr (Debian merges
#   /bin, /lib, /sbin into it), /etc (read-only: users,
#   hosts, ld.so.cache, /etc/slurm), /tmp, the project, the venv and the interpreter
#   it was made from, the cluster's folder (munge socket, slurm.conf) and $HOME;
# - no `hostname` (no UTS namespace: the node keeps its name), no cgroups of its own (crun runs
#   with --cgroup-manager=disabled; Slurm's own cgroup plugin, if any, confines the step).
set -euo pipefail

BUNDLE="${1:?usage: oci_bundle.sh BUNDLE [VENV]}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${2:-$REPO/.venv}"
CLUSTER_DIR="${SQ_CLUSTER_DIR:-$REPO/.cluster}"

mkdir -p "$BUNDLE"
BUNDLE="$(cd "$BUNDLE" && pwd)"
ROOTFS="$BUNDLE/rootfs"

binds=(/usr /etc /tmp "$REPO" "$CLUSTER_DIR")
[ -d "$VENV" ] && binds+=("$(readlink -f "$VENV")")
if [ -x "$VENV/bin/python" ]; then  # the interpreter the venv was made from (pyenv, /opt/...)
  binds+=("$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)')")
fi
[ -n "${HOME:-}" ] && [ -d "$HOME" ] && binds+=("$HOME")

# idempotent: `up` on a running cluster must not pull a running container's mount points away
mkdir -p "$ROOTFS"/{proc,sys,dev,run}
for link in bin lib lib64 sbin; do  # merged /usr: the links the host has
  [ -L "/$link" ] && [ ! -e "$ROOTFS/$link" ] && [ ! -L "$ROOTFS/$link" ] && ln -s "$(readlink "/$link")" "$ROOTFS/$link"
done
mounts=""
for b in $(printf '%s\n' "${binds[@]}" | awk 'NF && !seen[$0]++'); do
  [ -e "$b" ] || continue
  mkdir -p "$ROOTFS$b"
  ro=""
  [ "$b" = /etc ] || [ "$b" = /usr ] && ro=',"ro"'
  mounts+="$(printf '    {"destination": "%s", "type": "bind", "source": "%s", "options": ["rbind"%s]},' "$b" "$b" "$ro")"$'\n'
done

cat >"$BUNDLE/config.json.tmp" <<JSON
{
  "ociVersion": "1.0.0",
  "process": {
    "terminal": false,
    "user": {"uid": 0, "gid": 0},
    "args": ["/bin/sh"],
    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    "cwd": "/",
    "noNewPrivileges": false
  },
  "root": {"path": "rootfs", "readonly": false},
  "mounts": [
${mounts}    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro"]},
    {"destination": "/dev", "type": "bind", "source": "/dev", "options": ["rbind"]}
  ],
  "linux": {
    "namespaces": [{"type": "mount"}, {"type": "pid"}]
  }
}
JSON
if cmp -s "$BUNDLE/config.json.tmp" "$BUNDLE/config.json"; then
  rm -f "$BUNDLE/config.json.tmp"  # unchanged: its digest (sq.container.digest) stays
else
  mv -f "$BUNDLE/config.json.tmp" "$BUNDLE/config.json"
fi
echo "$BUNDLE"
