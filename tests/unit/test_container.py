"""partition.container: its checks (refused before submission), how each kind is launched through
submitit (golden sbatch scripts for Pyxis and Apptainer: flags on the srun line, never
`#SBATCH --container-image`), the requeue asked of the batch shell, and the stack and namespace
tags a rank writes.

Refresh the golden files: SQ_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_container.py -k golden
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.container import ContainerConfig, image_problems, mount_parts
from pipeline.config.schema import ConfigError
from pipeline.job import stack
from pipeline.slurm.container import ContainerSpec, launch, request_requeue
from pipeline.tracking import keys as K

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "integration" / "golden"
IMAGE_BYTES = b"a stand-in image\n"


# -- the schema's checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"kind": "docker", "image": "/x.sif"}, "partition.container.kind"),
        ({"kind": "apptainer"}, "partition.container.image"),  # a kind with no image
        ({"kind": "pyxis", "image": "  "}, "partition.container.image"),
        ({"kind": "apptainer", "image": "/x.sif", "mounts": ["/data"]}, "partition.container.mounts[0]"),
        ({"kind": "apptainer", "image": "/x.sif", "mounts": ["data:/data"]}, "partition.container.mounts[0]"),
        ({"kind": "apptainer", "image": "/x.sif", "mounts": ["/a:/b:rx"]}, "partition.container.mounts[0]"),
        ({"kind": "apptainer", "image": "/x.sif", "mounts": ["/a,/c:/b"]}, "partition.container.mounts[0]"),
        (
            {"kind": "apptainer", "image": "/x.sif", "mounts": ["/a:/b\n#SBATCH --x"]},
            "partition.container.mounts[0]",
        ),
        ({"kind": "apptainer", "image": "/x.sif", "env": ["NCCL_DEBUG=INFO"]}, "partition.container.env"),
        ({"kind": "apptainer", "image": "/x.sif", "env": ["$(id)"]}, "partition.container.env"),
        ({"kind": "apptainer", "image": "/x.sif", "python": "python3"}, "partition.container.python"),
        ({"kind": "pyxis", "image": "nvcr.io#x; rm -rf /"}, "partition.container.image"),
        ({"kind": "oci", "image": "/b", "mounts": ["/a:/b"]}, "partition.container.mounts"),
    ],
)
def test_bad_container_values_are_refused(fields: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key.replace('[', '.').replace(']', '.')}"):
        ContainerConfig(**fields)  # type: ignore[arg-type]


def test_mount_syntax() -> None:
    assert mount_parts("/a:/b") == ("/a", "/b", "rw")
    assert mount_parts("/a:/b:ro") == ("/a", "/b", "ro")
    assert mount_parts("/a") is None and mount_parts("/a:/b:ro:x") is None


def test_an_image_the_login_node_cannot_see_is_a_problem(tmp_path: Path) -> None:
    sif = tmp_path / "img.sif"
    missing = ContainerConfig(kind="apptainer", image=str(sif), mounts=[f"{tmp_path}/nope:/data"])
    problems = image_problems(missing, tmp_path)
    assert len(problems) == 2 and "is not a .sif file" in problems[0] and "nope does not exist" in problems[1]
    sif.write_bytes(IMAGE_BYTES)
    assert (
        image_problems(ContainerConfig(kind="apptainer", image="img.sif"), tmp_path) == []
    )  # relative: home's
    bundle = ContainerConfig(kind="oci", image=str(tmp_path))
    assert "OCI bundle folder with config.json" in image_problems(bundle, tmp_path)[0]
    # a registry reference only the node can pull: nothing to check here
    assert (
        image_problems(ContainerConfig(kind="pyxis", image="nvcr.io#nvidia/pytorch:24.01-py3"), tmp_path)
        == []
    )


def test_bad_container_settings_are_refused_before_submission(tmp_path: Path) -> None:
    """Missing image, malformed mount, a kind with no image: ConfigError (the CLI's exit 2, one
    paragraph) from composition or the sweep's point checks, before anything is submitted."""
    from pipeline.config.compose import compose_sweep
    from pipeline.config.validate import check_points

    base = ["partition=ci_a100", "partition.container.kind=apptainer"]
    missing = compose_sweep("slurm_ci", [*base, f"partition.container.image={tmp_path}/missing.sif"])
    with pytest.raises(ConfigError, match=r"missing.sif.*is not a .sif file this login node can see"):
        check_points([(p.point_id, p.cfg) for p in missing])
    with pytest.raises(ConfigError, match=r"partition.container.mounts"):
        compose_sweep(
            "slurm_ci",
            [*base, f"partition.container.image={tmp_path}/x.sif", "partition.container.mounts=[/data]"],
        )
    with pytest.raises(ConfigError, match="kind apptainer has no image"):
        compose_sweep("slurm_ci", base)


def test_the_cli_exits_2_on_a_kind_with_no_image(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["sweep", "partition=ci_a100", "partition.container.kind=pyxis", f"runs_dir={tmp_path}/runs"]
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "kind pyxis has no image" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()


# -- launch ------------------------------------------------------------------------------------


def _spec(**fields: object) -> ContainerSpec:
    spec = ContainerSpec.of(ContainerConfig(**fields), Path("/home/p"))  # type: ignore[arg-type]
    assert spec is not None
    return spec


def test_pyxis_goes_on_the_srun_line_and_binds_at_the_same_paths() -> None:
    spec = _spec(
        kind="pyxis", image="nvcr.io#nvidia/pytorch:24.01-py3", mounts=["/data:/data:ro"], env=["NCCL_DEBUG"]
    )
    plan = launch(spec, Path("/runs/s/submitit"), ["/home/p", "/runs", "/data"], "/venv/bin/python", gpu=True)
    assert plan.srun_args == (
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/data:/data:ro,/home/p:/home/p,/runs:/runs",  # /data: the user's mount stands
        "--container-workdir=/home/p",
        "--container-env=NCCL_DEBUG",
    )
    assert plan.python is None  # the venv's interpreter at its own path, bound in


def test_apptainer_replaces_the_interpreter() -> None:
    spec = _spec(kind="apptainer", image="/img/x.sif", python="/opt/venv/bin/python", env=["HF_HOME"])
    plan = launch(spec, Path("/r/submitit"), ["/home/p"], "/venv/bin/python", gpu=True)
    assert plan.srun_args == ()
    assert (
        plan.python
        == "apptainer exec --nv --bind /home/p:/home/p --pwd /home/p /img/x.sif /opt/venv/bin/python"
    )
    assert '[ -n "${HF_HOME+x}" ] && export APPTAINERENV_HF_HOME="$HF_HOME"' in plan.setup
    cpu = launch(spec, Path("/r/submitit"), ["/home/p"], "/venv/bin/python", gpu=False)
    assert cpu.python is not None and "--nv" not in cpu.python  # no driver to bind on a CPU node


def test_oci_is_srun_container() -> None:
    plan = launch(
        _spec(kind="oci", image="/b/bundle"), Path("/r/submitit"), [], "/venv/bin/python", gpu=False
    )
    assert plan.srun_args == ("--container=/b/bundle",) and plan.python is None


def test_the_batch_shell_requeues_what_a_rank_asked(tmp_path: Path) -> None:
    """The setup lines run in bash as the batch script would: a rank's request (the file) makes
    the EXIT trap run `scontrol requeue <task>` on the host; without one it does nothing."""
    spec = _spec(kind="oci", image="/b/bundle")
    plan = launch(spec, tmp_path / "submitit", [], "/venv/bin/python", gpu=False, digest="sha256:ab")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.calls\n')
    (fake / "scontrol").chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "SLURM_JOB_ID": "57",
        "SLURM_ARRAY_JOB_ID": "55",
        "SLURM_ARRAY_TASK_ID": "2",
    }
    script = "\n".join([*plan.setup, 'echo "$SQ_CONTAINER|$SQ_CONTAINER_DIGEST"; eval "$RANK"'])
    quiet = subprocess.run(
        ["bash", "-c", script], env={**env, "RANK": "true"}, capture_output=True, text=True
    )
    assert quiet.stdout.splitlines()[0] == "oci:/b/bundle|sha256:ab"
    assert not (tmp_path / "scontrol.calls").exists()
    rank = f"{sys.executable} -c 'from pipeline.slurm.container import request_requeue; assert request_requeue()'"
    asked = subprocess.run(
        ["bash", "-c", script], env={**env, "RANK": rank, "PYTHONPATH": str(REPO)}, text=True
    )
    assert asked.returncode == 0
    assert (tmp_path / "scontrol.calls").read_text() == "requeue 55_2\n"  # the task's own id, not the array's
    assert list((tmp_path / "submitit" / "requeue").iterdir()) == []  # the request is consumed
    assert request_requeue({}) is False  # not in an image: the caller runs scontrol itself


# -- golden sbatch scripts ---------------------------------------------------------------------

GOLDEN_CASES = {
    # an image of its own python, registry reference, a site mount, NCCL settings from the host
    "pyxis_image_python": [
        "partition=ci_h100",
        "parallelism.gpus_per_node=1",
        "partition.container.kind=pyxis",
        "partition.container.image='nvcr.io#nvidia/pytorch:24.01-py3'",  # quoted: # is Hydra syntax
        "partition.container.python=/usr/bin/python3",
        "partition.container.mounts=[/etc:/host/etc:ro]",
        "partition.container.workdir=/workspace",
        "partition.container.env=[NCCL_DEBUG,HF_HOME]",
    ],
    "apptainer_image_python": [
        "partition=ci_a100",
        "parallelism.gpus_per_node=1",
        "partition.container.kind=apptainer",
        "partition.container.image=<IMAGE>",
        "partition.container.python=/opt/venv/bin/python",
        "partition.container.env=[NCCL_DEBUG]",
    ],
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_container_sbatch_script_matches_golden(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.config.compose import compose_sweep
    from pipeline.home import project_home
    from pipeline.submit.launcher import group_by_shape, sbatch_script

    image = tmp_path / "image.sif"
    image.write_bytes(IMAGE_BYTES)
    runs = tmp_path / "runs"
    overrides = [o.replace("<IMAGE>", str(image)) for o in GOLDEN_CASES[case]] + [f"runs_dir={runs}"]
    points = compose_sweep("slurm_ci", overrides)
    ((shape, indices),) = group_by_shape([(i, p.cfg) for i, p in enumerate(points)]).items()
    folder = runs / "SWEEP" / "submitit"
    text = sbatch_script(folder, shape, points[0].cfg.launcher, "sq-SWEEP", len(indices))
    for path, name in (
        (folder, "<FOLDER>"),
        (runs, "<RUNS>"),
        (image, "<IMAGE>"),
        (project_home(), "<HOME>"),
    ):
        text = text.replace(str(path), name)
    text = text.replace(sys.executable, "<PYTHON>")
    assert "#SBATCH --container" not in text  # the batch script itself stays on the host
    srun = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    if case.startswith("pyxis"):
        assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in srun[0]
        assert srun[0].endswith("/usr/bin/python3 -u -m submitit.core._submit <FOLDER>")
    else:
        assert "apptainer exec --nv --bind" in srun[0] and "<IMAGE> /opt/venv/bin/python -u -m" in srun[0]
        digest = "sha256:" + hashlib.sha256(IMAGE_BYTES).hexdigest()  # the file's own hash, by hand
        assert f"export SQ_CONTAINER_DIGEST={digest}" in text
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("SQ_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}: run SQ_UPDATE_GOLDEN=1 pytest {__file__} -k golden"
    assert text == golden.read_text(), (
        f"the sbatch script for {case} differs from {golden}; if intended, refresh it with "
        f"SQ_UPDATE_GOLDEN=1 .venv/bin/python -m pytest {__file__} -k golden and review the diff.\n{text}"
    )


# -- the rank's tags ---------------------------------------------------------------------------


def test_stack_tags_are_the_libraries_own_and_absent_where_unknown() -> None:
    import importlib.metadata as md

    import torch

    tags = stack.stack_tags()
    assert tags[K.stack_tag("torch")] == md.version("torch")
    assert tags[K.stack_tag("deepspeed")] == md.version("deepspeed")
    assert tags[K.stack_tag("transformers")] == md.version("transformers")
    assert tags[K.stack_tag("python")] == ".".join(map(str, sys.version_info[:3]))
    if torch.version.cuda is None:  # a CPU build: no CUDA, cuDNN or NCCL, never "unknown" or 0
        assert not {K.stack_tag(n) for n in ("cuda", "cudnn", "nccl")} & set(tags)
    if not Path("/proc/driver/nvidia/version").exists():
        assert K.stack_tag("driver") not in tags
    assert set(tags) <= {K.stack_tag(n) for n in K.STACK_NAMES}
    assert all(v and v not in ("0", "unknown") for v in tags.values())


def test_container_tags_tell_inside_from_the_host() -> None:
    host = os.readlink("/proc/self/ns/mnt")
    here = stack.namespaces()
    assert here["mnt"] == host  # this test runs on the host
    on_host = stack.container_tags("none", [here, here], {stack.HOST_MNTNS_ENV: host})
    assert on_host[K.TAG_CONTAINER_INSIDE] == "no"
    inside = {**here, "mnt": "mnt:[1]"}
    tags = stack.container_tags(
        "oci:/b", [inside, inside], {stack.HOST_MNTNS_ENV: host, stack.DIGEST_ENV: "sha256:x"}
    )
    assert tags[K.TAG_CONTAINER_INSIDE] == "yes" and tags[K.TAG_CONTAINER_DIGEST] == "sha256:x"
    assert (
        tags[K.TAG_CONTAINER_MNTNS].split()[1].startswith("1:") and tags[K.TAG_CONTAINER_HOST_MNTNS] == host
    )
    assert stack.inside_image([inside, here], host) is False  # one rank on the host is enough to fail
    assert K.TAG_CONTAINER_INSIDE not in stack.container_tags("none", [here], {})  # no host's to compare
