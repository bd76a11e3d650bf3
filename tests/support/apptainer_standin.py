"""A stand-in for `apptainer exec` (Apptainer is not packaged for these machines): it runs the
command through `crun` in a mount namespace of its own, as Apptainer does by default (its own
mount namespace, the host's pid namespace and network), with Apptainer's default binds (/tmp,
$HOME, /proc, /sys, /dev) and the `--bind` list it was given, so that the Apptainer launch path
(pipeline.slurm.container: the interpreter replaced by `apptainer exec ... image.sif python`)
runs end to end. The "image" is a file that must exist; its user space is the host's /usr and
/etc (read-only), since there is no real image to unpack.

    apptainer exec [--nv] [--bind SRC:DST[:ro],...] [--pwd DIR] IMAGE COMMAND ARGS...

Every call appends its arguments as one JSON line to $SQ_APPTAINER_LOG when that is set.
Run by /usr/bin/python3 (no project import).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile

DEFAULT_BINDS = ["/tmp", os.environ.get("HOME", "/root"), "/dev"]
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def parse(argv: list[str]) -> tuple[bool, list[str], str, str, list[str]]:
    if not argv or argv[0] != "exec":
        sys.exit(f"apptainer stand-in: only `exec` is supported, got {argv[:1]}")
    nv, binds, pwd, i = False, [], os.getcwd(), 1
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag == "--nv":
            nv = True
        elif flag in ("--bind", "-B"):
            i += 1
            binds += [b for b in argv[i].split(",") if b]
        elif flag == "--pwd":
            i += 1
            pwd = argv[i]
        else:
            sys.exit(f"apptainer stand-in: unknown option {flag}")
        i += 1
    if i + 1 >= len(argv):
        sys.exit("apptainer stand-in: usage: exec [options] IMAGE COMMAND ...")
    return nv, binds, pwd, argv[i], argv[i + 1 :]


def mount(src: str, dst: str, ro: bool = False) -> dict[str, object]:
    return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", *(["ro"] if ro else [])]}


def bundle(folder: str, binds: list[str], pwd: str, command: list[str]) -> None:
    rootfs = os.path.join(folder, "rootfs")
    mounts = [mount("/usr", "/usr", True), mount("/etc", "/etc", True)]
    for entry in [*(f"{d}:{d}" for d in DEFAULT_BINDS if os.path.isdir(d)), *binds]:
        parts = entry.split(":")
        src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
        mounts.append(mount(src, dst, len(parts) > 2 and parts[2] == "ro"))
    for m in mounts:
        os.makedirs(rootfs + str(m["destination"]), exist_ok=True)
    for d in ("proc", "sys"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink("/" + link):
            os.symlink(os.readlink("/" + link), os.path.join(rootfs, link))
    spec = {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": os.getuid(), "gid": os.getgid()},
            "args": command,
            "env": [f"{k}={v}" for k, v in os.environ.items()],
            "cwd": pwd,
        },
        "root": {"path": "rootfs", "readonly": False},
        "mounts": [
            *mounts,
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro"]},
        ],
        "linux": {"namespaces": [{"type": "mount"}]},  # Apptainer's default: the host's pids and network
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(spec, f)


def main(argv: list[str]) -> int:
    nv, binds, pwd, image, command = parse(argv)
    if os.environ.get("SQ_APPTAINER_LOG"):
        with open(os.environ["SQ_APPTAINER_LOG"], "a") as f:
            f.write(
                json.dumps({"nv": nv, "bind": binds, "pwd": pwd, "image": image, "command": command}) + "\n"
            )
    if not os.path.isfile(image):
        sys.exit(f"apptainer stand-in: could not open image {image}: no such file")
    folder = tempfile.mkdtemp(prefix="sq-apptainer-")
    try:
        bundle(folder, binds, pwd, command)
        state = os.path.join(folder, "state")
        name = f"sq-apptainer-{socket.gethostname()}-{os.getpid()}"
        pid = os.fork()
        if pid == 0:
            os.execvp(
                "crun",
                ["crun", "--cgroup-manager=disabled", f"--root={state}", "run", "--bundle", folder, name],
            )
        for sig in FORWARDED:  # Slurm's warning reaches crun, which passes it to the command
            signal.signal(sig, lambda s, _f: os.kill(pid, s))
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        return os.waitstatus_to_exitcode(status) & 0xFF
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
