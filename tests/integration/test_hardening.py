"""Hardening (issue #14): credentials never leave the process, hostile values cannot add lines
to an sbatch script, the Makefile passes ARGS through as typed, a sweep never depends on MLflow
answering (its runs are replayed by `qualify sync` to the URI each ledger recorded, and end
FINISHED or FAILED), two sweeps can create the same new SQLite store at once.

Refresh the golden file: SQ_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_hardening.py -k golden
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.config.schema import ConfigError
from pipeline.tracking import redact
from pipeline.tracking.ledger import Tracker
from tests.support.helpers import PY, REPO, fp16_ending, qualify
from tests.support.slurm_fixtures import SERVER_START_S, _healthy, free_port, server_env
from tests.support.slurm_sweep import ONE_RANK

GOLDEN = Path(__file__).parent / "golden"
PASSWORD = "pw-Zq8v$x"  # unusual enough that grep finds only it


@pytest.fixture
def clean_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a test moves into MLflow's credential variables is undone afterwards."""
    monkeypatch.delenv(redact.USER_ENV, raising=False)
    monkeypatch.delenv(redact.PASSWORD_ENV, raising=False)


# --------------------------------------------------------------------------------------------
# credentials and secret keys


@pytest.mark.parametrize(
    ("uri", "clean", "user", "password"),
    [
        ("http://alice:s3cret@host:5000/x?y=1", "http://host:5000/x?y=1", "alice", "s3cret"),
        ("https://tok@mlflow.example.org", "https://mlflow.example.org", "tok", None),
        ("http://a%40b:p%3Aw%40@h:1", "http://h:1", "a@b", "p:w@"),
        ("http://host:5000", "http://host:5000", None, None),
        ("sqlite:////tmp/x/mlruns.db", "sqlite:////tmp/x/mlruns.db", None, None),
    ],
)
def test_split_userinfo(uri: str, clean: str, user: str | None, password: str | None) -> None:
    assert redact.split_userinfo(uri) == (clean, user, password)


def test_strip_userinfo_in_free_text() -> None:
    redact.split_userinfo("http://bob:hunter22@h:1")  # once seen, the bare secret is masked too
    text = "tracking.uri=http://bob:hunter22@h:1 and postgresql://u:p@db/x, then hunter22 alone"
    assert redact.strip_userinfo(text) == "tracking.uri=http://h:1 and postgresql://db/x, then *** alone"
    assert redact.strip_userinfo("/home/bob/runs") == "/home/bob/runs", "a user name is no secret"


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("tracking.password", True),
        ("hf_token", True),
        ("data.api_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("openaiApiKey", True),
        ("model.n_kv_heads", False),
        ("data.tokens_per_step", False),
        ("tracking.redact_patterns", False),
        ("sq.reason_detail", False),
        ("data.text_key", False),  # the JSONL field the text is read from
    ],
)
def test_secret_key_patterns(key: str, secret: bool) -> None:
    assert redact.is_secret_key(key) is secret


def test_tracker_writes_no_credential_anywhere(tmp_path: Path, clean_credentials: None) -> None:
    """User-info goes to MLflow's environment variables, never into the ledger folder; secret
    keys' values are *** in params and tags; other values keep their text minus user-info."""
    t = Tracker(f"http://carol:{PASSWORD}@127.0.0.1:9", "e", tmp_path, run_name="r", offline=True)
    t.log_params({"tracking.uri": f"http://carol:{PASSWORD}@127.0.0.1:9", "train.lr": 0.1})
    t.set_tags({"hf_token": "abcdef123", "sq.note": "fine"})
    t.close()
    assert os.environ[redact.USER_ENV] == "carol" and os.environ[redact.PASSWORD_ENV] == PASSWORD
    assert t.uri == "http://127.0.0.1:9"
    written = "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    assert PASSWORD not in written and "carol" not in written and "abcdef123" not in written
    events = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert events[0]["d"] == {"tracking.uri": "http://127.0.0.1:9", "train.lr": "0.1"}
    assert events[1]["d"] == {"hf_token": "***", "sq.note": "fine"}
    assert events[-1]["k"] == "e" and events[-1]["d"] == "FINISHED"


def test_plan_strips_credentials_from_what_it_writes(tmp_path: Path, clean_credentials: None) -> None:
    from pipeline.submit.sweep import plan, write_point_files

    uri = f"http://dave:{PASSWORD}@127.0.0.1:9"
    pl = plan("smoke", [f"tracking.uri={uri}", f"runs_dir={tmp_path}"], launcher_kind="local")
    write_point_files(pl)
    pl.manifest.write(tmp_path)
    assert pl.manifest.tracking_uri == "http://127.0.0.1:9"
    assert pl.points[0].cfg.tracking.uri == "http://127.0.0.1:9"
    assert os.environ[redact.PASSWORD_ENV] == PASSWORD  # where MLflow (and the jobs) read it
    found = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD in p.read_text()]
    assert not found and PASSWORD not in pl.points[0].yaml
    assert "tracking.uri=http://127.0.0.1:9" in pl.manifest.user_overrides


def test_plan_keeps_what_the_job_needs(tmp_path: Path, clean_credentials: None) -> None:
    """Redaction reaches secrets only: the JSONL field a text corpus is read from reaches the
    job's config as typed (redacted, the job looked for a field named ***)."""
    import yaml

    from pipeline.submit.sweep import plan

    pl = plan("smoke", ["data.text_key=body", f"runs_dir={tmp_path}"], launcher_kind="local")
    assert yaml.safe_load(pl.points[0].yaml)["data"]["text_key"] == "body"
    assert "data.text_key=body" in pl.points[0].overrides


# secrets inside values: known token shapes, NAME=value, values the user marks secret

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh"
TOKENS = {
    "hf": HF,
    "ghp": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "openai": "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
    "slack": "xoxb-123456789012-abcdefABCDEF",
    "bearer": "Bearer eyJhbGciOiJIUzI1NiJ9.abcdefghijklmnop",
}
MARKED = "my-own-s3cret-42"  # no known shape: the user marks it (tracking.secrets)
SECRET_SETUP = [
    "export HF_TOKEN=hf_x",  # the case: too short for a shape, caught by its name
    *(f"echo {v}" for v in TOKENS.values()),
    f"echo {MARKED}",
]
SECRET_TEXTS = ["hf_x", *TOKENS.values(), MARKED]


def _bare(secret: str) -> str:
    return secret.removeprefix("Bearer ")


@pytest.mark.parametrize(("shape", "secret"), sorted(TOKENS.items()))
def test_a_token_is_masked_by_its_shape_anywhere_in_a_value(shape: str, secret: str) -> None:
    text = f"pre {secret} post"
    masked = redact.redact_text(text)
    assert _bare(secret) not in masked and masked.startswith("pre ") and masked.endswith(" post"), masked


@pytest.mark.parametrize(
    "text",
    ["sk-learn", "hf_home", "/models/key:v1", "data.text_key=body", "train.lr=0.1", "tokens_per_step=8",
     "Bearer tokens", "AKIA", "module load cuda/12.4", "http://host:5000/x"],
)  # fmt: skip
def test_ordinary_values_are_not_masked(text: str) -> None:
    assert redact.redact_text(text) == text


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("export HF_TOKEN=hf_x", "export HF_TOKEN=***"),
        ("--password=abc rest", "--password=*** rest"),
        ("api_key: 'xyz'", "api_key: '***'"),
        ("WANDB_API_KEY=0123 && run", "WANDB_API_KEY=*** && run"),
    ],
)
def test_a_value_assigned_to_a_secret_name_is_masked(text: str, masked: str) -> None:
    assert redact.redact_text(text) == masked


def test_secrets_in_values_reach_no_file_the_sweep_writes(tmp_path: Path, clean_credentials: None) -> None:
    """Issue #25 item 4: `partition.setup=['export HF_TOKEN=hf_x']` reached the manifest,
    config.yaml, the overrides and MLflow params (redaction looked at key names only). Every
    file the sweep writes before its jobs, and what a job's tracker logs, hold none of them;
    the job's config keeps the setup line's shape with *** in place of each secret."""
    import yaml

    from pipeline.submit.sweep import plan, write_point_files

    setup = "[" + ",".join(f"'{line}'" for line in SECRET_SETUP) + "]"
    overrides = [f"partition.setup={setup}", f"tracking.secrets=[{MARKED}]", f"runs_dir={tmp_path}",
                 f"tracking.experiment=e-{TOKENS['aws']}"]  # fmt: skip
    pl = plan("smoke", overrides, launcher_kind="local")
    assert any("not run by the local launcher" in n for n in pl.notes), pl.notes
    write_point_files(pl)
    pl.manifest.write(tmp_path)
    t = Tracker("http://127.0.0.1:9", "e", tmp_path / "ledger", run_name="r", offline=True)
    cfg = yaml.safe_load(pl.points[0].yaml)
    t.log_params({"partition.setup": str(cfg["partition"]["setup"]), "x": f"see {TOKENS['ghp']}"})
    t.set_tags({"sq.overrides": " ".join(pl.points[0].overrides)})
    t.close()
    written = "\n".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    leaked = [s for s in SECRET_TEXTS if _bare(s) in written or _bare(s) in pl.points[0].yaml]
    assert not leaked, f"written in plain text: {leaked}"
    assert cfg["partition"]["setup"][0] == "export HF_TOKEN=***"
    assert cfg["partition"]["setup"][1] == "echo ***"
    assert pl.points[0].cfg.partition.setup[0] == "export HF_TOKEN=hf_x", "sbatch still gets the real line"


@pytest.mark.slow
def test_secrets_in_values_reach_no_file_of_a_real_sweep(tmp_path: Path) -> None:
    """The same through a real local sweep (a refused fp16 point: the job path, its tracker,
    the pickled job, MLflow's store): no secret in any file under the runs folder or in the
    SQLite store, params, tags and artifacts included."""
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    setup = "[" + ",".join(f"'{line}'" for line in SECRET_SETUP) + "]"
    res = qualify(
        ["sweep", "--sweep", "smoke", "--launcher", "local", f"runs_dir={runs}", f"tracking.uri=sqlite:///{db}",
         "precision=fp16", f"partition.setup={setup}", f"tracking.secrets=[{MARKED}]"],
        timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "not run by the local launcher" in res.stdout
    for secret in SECRET_TEXTS:
        hits = subprocess.run(
            ["grep", "-rlaF", _bare(secret), str(runs), str(db)], capture_output=True, text=True
        )
        assert hits.returncode == 1, f"{secret!r} was written to: {hits.stdout}"
    assert b"HF_TOKEN=***" in db.read_bytes(), "the setup line is recorded, masked"


# --------------------------------------------------------------------------------------------
# sbatch scripts with hostile values


HOSTILE = {
    "account": "acct'; touch pwned; echo '",
    "qos": 'hi"gh $(id) `whoami`',
    "constraint": "nvlink&[ü|ß]#not-a-comment",
    "gres": "gpu:a100 ;touch pwned:2",
}


def _hostile_shape() -> object:
    from pipeline.config.compose import compose_sweep
    from pipeline.submit.launcher import ResourceShape

    (point,) = compose_sweep("slurm_ci", ["partition=ci_a100"])
    # built here, not composed: whatever composition lets through, the rendering must hold
    return replace(ResourceShape.of(point.cfg), setup=("module load cuda/12.4 # ü",), **HOSTILE)


def _render(shape: object, tmp_path: Path) -> str:
    from pipeline.config.schema import LauncherConfig
    from pipeline.submit.launcher import sbatch_script

    folder = tmp_path / "runs" / "SWEEP" / "submitit"
    text = sbatch_script(folder, shape, LauncherConfig(), "sq-SWEEP", 1)  # type: ignore[arg-type]
    return text.replace(str(folder), "<FOLDER>").replace(sys.executable, "<PYTHON>")


def _directives(text: str) -> dict[str, str]:
    """The options sbatch reads: `#SBATCH` lines up to the first command, each value unquoted
    as sbatch's own parser does (quotes group, # outside quotes starts a comment)."""
    out: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break  # sbatch stops reading directives at the first command
        if line.startswith("#SBATCH "):
            (word,) = shlex.split(line.removeprefix("#SBATCH "), comments=True)
            key, _, value = word.partition("=")
            out[key] = value
    return out


def test_hostile_values_render_exactly_the_intended_directives(tmp_path: Path) -> None:
    text = _render(_hostile_shape(), tmp_path)
    golden = GOLDEN / "hostile_values.sbatch"
    if os.environ.get("SQ_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"the sbatch script differs from {golden}; if intended, refresh it with "
        f"SQ_UPDATE_GOLDEN=1 pytest {__file__} -k golden and review the diff.\n{text}"
    )
    d = _directives(text)
    assert {k: d[f"--{k}"] for k in HOSTILE} == HOSTILE, "every value arrives whole, as typed"
    assert sorted(d) == sorted(
        f"--{k}"
        for k in (
            "account", "constraint", "cpus-per-task", "gres", "job-name", "mem", "nodes",
            "ntasks-per-node", "open-mode", "output", "partition", "qos", "signal", "time", "wckey",
        )
    ), "no directive more, none lost"  # fmt: skip
    # the batch shell sees the GRES as one quoted word, and nothing of it runs
    export = next(line for line in text.splitlines() if line.startswith("export SQ_GRES="))
    assert shlex.split(export) == ["export", f"SQ_GRES={HOSTILE['gres']}"]


def test_golden_hostile_script_runs_nothing_it_was_given(tmp_path: Path) -> None:
    """The rendered script up to its command, run by bash: only the intended lines execute
    (no `pwned` file appears, SQ_GRES holds the value as typed)."""
    text = _render(_hostile_shape(), tmp_path)
    head = text.split("\n# command", 1)[0].replace("module load cuda/12.4", "true")  # no modules here
    out = subprocess.run(
        ["bash", "-c", head + '\nprintf %s "$SQ_GRES"'], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == HOSTILE["gres"]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("account", "acct\n#SBATCH --uid=0\ntouch x"),
        ("qos", "high\r"),
        ("constraint", "a\u2028b"),
        ("partition", "a100\x00"),
        ("setup", ("ok", "echo a\necho b")),
    ],
)
def test_line_breaks_never_reach_a_script(field: str, value: object, tmp_path: Path) -> None:
    shape = replace(_hostile_shape(), **{field: value})  # type: ignore[type-var]
    with pytest.raises(ConfigError, match=r"partition\.\w+.*control character or line break"):
        _render(shape, tmp_path)


def test_a_newline_in_a_partition_value_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    res = qualify(
        ["sweep", "--sweep", "slurm_ci", "--launcher", "slurm", "partition=ci_a100",
         "partition.account='acct\n#SBATCH --uid=0\ntouch x'", f"runs_dir={runs}"],
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "partition.account" in res.stderr and "Traceback" not in res.stderr
    assert not runs.exists() and not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------------------
# the Makefile passes ARGS as typed


def test_makefile_passes_args_unexpanded_and_runs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()
    show = tmp_path / "show-argv"  # stands in for qualify: prints the words qualify would parse
    show.write_text(
        f"#!/bin/sh\ncd {shlex.quote(str(REPO))} && exec {shlex.quote(PY)} -c "
        "'import json, sys; from pipeline.cli import expand_env_args; "
        'print(json.dumps(expand_env_args(sys.argv[1:])))\' "$@"\n'
    )
    show.chmod(0o755)
    pwned = tmp_path / "pwned"
    args = f"train.lr=$HOME `touch {pwned}` \"a b\" $(id) x;y 'q'"
    res = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed", "sweep",
         f"VENV={venv}", f"QUALIFY={show}", f"ARGS={args}", "SWEEP=smo$PATH"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    argv = json.loads(res.stdout.strip().splitlines()[-1])
    assert argv == [
        "sweep", "--sweep", "smo$PATH",
        "train.lr=$HOME", "`touch", f"{pwned}`", "a b", "$(id)", "x;y", "q",
    ]  # fmt: skip
    assert not pwned.exists(), "a backtick in ARGS ran"


def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv that make thinks is installed, and a `qualify` that prints the words it gets."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    show = tmp_path / "show-argv"
    show.write_text(
        f"#!/bin/sh\ncd {shlex.quote(str(REPO))} && exec {shlex.quote(PY)} -c "
        "'import json, sys; from pipeline.cli import expand_env_args; "
        'print(json.dumps(expand_env_args(sys.argv[1:])))\' "$@"\n'
    )
    show.chmod(0o755)
    return venv, show


HOSTILE_MAKE = "$(shell touch {pwned})y"


@pytest.mark.parametrize(
    "target", ["status", "cancel", "resume", "report", "launch", "baseline", "sync", "sweep", "fit"]
)
@pytest.mark.parametrize("var", ["SWEEP", "WAIT", "ARGS"])
def test_makefile_runs_no_make_code_from_sweep_or_wait(tmp_path: Path, target: str, var: str) -> None:
    """`make status SWEEP='$(shell touch x)y'` ran the command (make expanded $(SWEEP) in
    `$(if $(SWEEP),...)`, and exported every command-line variable to the recipes, expanded):
    SWEEP, WAIT and ARGS are data only, and reach qualify as typed."""
    venv, show = _fake_venv(tmp_path)
    pwned = tmp_path / "pwned"
    value = HOSTILE_MAKE.format(pwned=pwned)
    res = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed", target,
         f"VENV={venv}", f"QUALIFY={show}", f"{var}={value}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert not pwned.exists(), f"make ran code from {var}"
    assert res.returncode == 0, res.stderr
    argv = json.loads(res.stdout.strip().splitlines()[-1])
    if var == "SWEEP":
        assert argv[argv.index("--sweep") + 1] == value, argv
    elif var == "ARGS" and target not in ("status", "cancel"):
        assert argv[-3:] == ["$(shell", "touch", f"{pwned})y"], argv
    elif var == "WAIT" and target == "sweep":
        assert "--wait" in argv


@pytest.mark.parametrize("var", ["HOST", "PORT", "BACKEND", "MLFLOW_BACKEND", "WORKERS"])
@pytest.mark.parametrize("payload", ["$(shell touch {pwned})", "x;touch {pwned}", "`touch {pwned}`"])
def test_makefile_passes_host_and_port_as_data(tmp_path: Path, var: str, payload: str) -> None:
    """HOST and PORT reached the recipe's shell spliced in (`--host $(HOST)`): make code and
    shell code in them ran. Now `make ui` and `make mlflow-server` get them as single words
    (a stand-in mlflow prints them) or refuse them; nothing runs."""
    venv, _ = _fake_venv(tmp_path)
    (venv / "bin" / "python").symlink_to(PY)
    mlflow = venv / "bin" / "mlflow"
    mlflow.write_text(f"#!{PY}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    mlflow.chmod(0o755)
    pwned, value = tmp_path / "pwned", payload.format(pwned=tmp_path / "pwned")
    for target in ("ui", "mlflow-server"):
        res = subprocess.run(
            ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed", target, f"VENV={venv}", f"{var}={value}"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "SQ_MLFLOW_STATE": str(tmp_path / "state"), "ARTIFACTS": str(tmp_path / "a"),
                 "MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""},
        )  # fmt: skip
        assert not pwned.exists(), f"make {target} ran code from {var}: {res.stderr}"
        if res.returncode == 0:  # started (the stand-in): the value arrived as one word, or not at all
            argv = json.loads(res.stdout.strip().splitlines()[-1])
            assert value in argv or not any(value in a for a in argv), argv
        else:
            assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr


def test_makefile_help_mentions_no_variable_value(tmp_path: Path) -> None:
    """`make -n` (what would run) shows SWEEP and HOST only as environment references."""
    venv, show = _fake_venv(tmp_path)
    for target in ("status", "ui", "mlflow-server"):
        res = subprocess.run(
            ["make", "-n", "-C", str(REPO), "-o", f"{venv}/.installed", target, f"VENV={venv}",
             f"QUALIFY={show}", "SWEEP=$(info LEAK)", "HOST=$(info LEAK)", "PORT=$(info LEAK)"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "LEAK" not in res.stdout.replace("$(info LEAK)", ""), res.stdout


def test_an_unclosed_quote_in_args_is_a_clear_refusal() -> None:
    res = qualify(["sweep", "--args-from-env", "SQ_TEST_ARGS"], env={"SQ_TEST_ARGS": "train.lr='1"})
    assert res.returncode == 2
    assert "Cannot split SQ_TEST_ARGS" in res.stderr and "Traceback" not in res.stderr


# --------------------------------------------------------------------------------------------
# MLflow down for a whole sweep; sync; credentials; two sweeps on a new store


class LateServer:
    """A real `mlflow server` on a port chosen before it starts: a sweep records that URI while
    nothing answers there, then the server comes up (once per module) for `qualify sync`."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        if self.proc is not None:
            return self.uri
        mlflow = Path(sys.executable).parent / "mlflow"
        cmd = [
            str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination", str(self.root / "artifacts"), "--serve-artifacts",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        log = open(self.root / "server.log", "w")  # noqa: SIM115 (the server's lifetime)
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=server_env(), start_new_session=True
        )
        deadline = time.monotonic() + SERVER_START_S
        while not _healthy(self.uri):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server did not come up:\n{(self.root / 'server.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        return self.uri

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def late_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LateServer]:
    server = LateServer(tmp_path_factory.mktemp("late-server"))
    try:
        yield server
    finally:
        server.stop()


def ledger_metric_count(root: Path) -> int:
    """Metric values the ledgers under `root` hold: what MLflow must have after a sync."""
    n = 0
    for ledger in root.rglob("ledger.jsonl"):
        for line in ledger.read_text().splitlines():
            ev = json.loads(line)
            n += len(ev["d"]) if ev["k"] == "m" else 0
    return n


def stored_metric_count(client: object, runs: list) -> int:
    return sum(
        len(client.get_metric_history(r.info.run_id, key))  # type: ignore[attr-defined]
        for r in runs
        for key in r.data.metrics
    )


@pytest.mark.slow
def test_tracking_server_down_for_a_whole_sweep_then_sync(tmp_path: Path, late_server: LateServer) -> None:
    """The tracking URI (with credentials in it) answers nothing for the whole sweep: the sweep
    says so in one line, exits 0 with its summary, every point has its outcome. Then a real
    server comes up on that URI, `qualify sync` (no --tracking-uri: the recorded URI) restores
    every metric value and ends every run FINISHED or FAILED. The password is nowhere: not in
    the runs folder, the job logs, the server's database or its artifacts."""
    from mlflow.tracking import MlflowClient

    assert late_server.proc is None, "this test runs before any other starts the server"
    port = late_server.port
    runs = tmp_path / "runs"
    res = qualify(
        ["sweep", "--sweep", "smoke", "--launcher", "local", f"runs_dir={runs}",
         f"tracking.uri=http://erin:{PASSWORD}@127.0.0.1:{port}",
         "precision=fp32,fp16", "train.steps=6", "train.warmup_steps=1"],
        timeout=600,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("MLflow unreachable:") == 1, out
    assert "outcome" in res.stdout and "did not answer" in res.stdout, "the summary is printed"
    (sweep_dir,) = runs.iterdir()
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    outcomes = {
        p["point_id"]: json.loads((Path(p["point_dir"]) / "outcome.json").read_text())
        for p in manifest["points"]
    }
    fp16 = fp16_ending()  # refused at once, or trained where this CPU runs fp16
    assert sorted(o["outcome"] for o in outcomes.values()) == sorted(["accepted", fp16.outcome]), outcomes
    assert manifest["parent_run_id"] is None
    expected = ledger_metric_count(sweep_dir)
    assert expected > 20

    uri = late_server.start()
    sync = qualify(["sync", str(sweep_dir)], timeout=300)
    assert sync.returncode == 0, sync.stdout + sync.stderr
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    runs_ = client.search_runs([exp.experiment_id], max_results=100)
    points = [r for r in runs_ if r.data.tags.get("sq.kind") == "point"]
    (parent,) = [r for r in runs_ if r.data.tags.get("sq.kind") == "sweep"]
    stored = stored_metric_count(client, runs_)
    print(
        f"metric values: {expected} in the ledgers, {stored} in MLflow after sync, {expected - stored} lost"
    )
    print(
        "runs:",
        sorted((r.data.tags.get("sq.kind"), r.data.tags.get("sq.outcome"), r.info.status) for r in runs_),
    )
    assert stored == expected, "0 metric values lost"
    assert {r.info.status for r in runs_} <= {"FINISHED", "FAILED"}
    by_outcome = {r.data.tags["sq.outcome"]: r.info.status for r in points}
    assert by_outcome == {"accepted": "FINISHED", fp16.outcome: fp16.status}
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in points} == {parent.info.run_id}
    assert json.loads((sweep_dir / "manifest.json").read_text())["parent_run_id"] == parent.info.run_id
    # a second sync sends nothing twice
    assert qualify(["sync", str(sweep_dir)], timeout=120).returncode == 0
    assert stored_metric_count(client, runs_) == expected

    hits = subprocess.run(
        ["grep", "-rl", PASSWORD, str(runs), str(late_server.root)], capture_output=True, text=True
    )
    assert hits.returncode == 1 and not hits.stdout, f"the password was written to: {hits.stdout}"


@pytest.mark.slurm
def test_tracking_server_down_for_a_whole_slurm_sweep_then_sync(
    tmp_path: Path, slurm_cluster: None, late_server: LateServer
) -> None:
    """The same on the local Slurm: the sweep (--wait) exits 0 with its summary and every point
    has its outcome while nothing answers at the tracking URI; `qualify sync --tracking-uri`
    then sends every ledger (the parent's too) to the server that does answer. The point is a
    refused fp16 one: a real array job through sbatch, ended at once."""
    from mlflow.tracking import MlflowClient

    runs = tmp_path / "runs"
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    res = qualify(
        ["sweep", "--sweep", "slurm_ci", "--launcher", "slurm", "--wait", "partition=ci_a100", "precision=fp16",
         "train.steps=6", "train.warmup_steps=1", ONE_RANK,
         f"runs_dir={runs}", f"tracking.uri=http://127.0.0.1:{free_port()}", "tracking.experiment=slurm-down"],
        timeout=300, env=env,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("MLflow unreachable:") == 1 and "did not answer" in res.stdout, out
    (sweep_dir,) = runs.iterdir()
    (point,) = json.loads((sweep_dir / "manifest.json").read_text())["points"]
    outcome = json.loads((Path(point["point_dir"]) / "outcome.json").read_text())
    fp16 = fp16_ending()  # refused at once, or trained where this CPU runs fp16
    assert (outcome["outcome"], outcome["reason"]) == (fp16.outcome, fp16.reason)
    expected = ledger_metric_count(sweep_dir)

    uri = late_server.start()
    sync = qualify(["sync", str(sweep_dir), "--tracking-uri", uri], timeout=120)
    assert sync.returncode == 0, sync.stdout + sync.stderr
    client = MlflowClient(uri)
    runs_ = client.search_runs([client.get_experiment_by_name("slurm-down").experiment_id])
    assert sorted((r.data.tags["sq.kind"], r.info.status) for r in runs_) == [
        ("point", fp16.status),
        ("sweep", "FINISHED"),
    ]
    stored = stored_metric_count(client, runs_)
    print(f"slurm: metric values {expected} in the ledgers, {stored} in MLflow after sync")
    assert stored == expected


@pytest.mark.slow
def test_two_sweeps_create_the_same_new_store_at_once(tmp_path: Path) -> None:
    """Both sweeps start on a store that does not exist yet; each creates or migrates it under
    the lock, so neither dies of MLflow's "duplicate column name" migration race. The points
    are refused fp16 ones: they end at once, through the real job path and tracker."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared' / 'mlruns.db'}"
    args = [PY, "-m", "pipeline.cli", "sweep", "--sweep", "smoke", "--launcher", "local",
            "precision=fp16", "train.steps=6", "train.warmup_steps=1", f"tracking.uri={uri}"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*args, f"runs_dir={tmp_path / f'runs{i}'}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
        assert "unreachable" not in out and "duplicate column" not in out, out[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("slurm-qualify").experiment_id])
    assert sorted(r.data.tags.get("sq.kind") for r in runs) == ["point", "point", "sweep", "sweep"]
    assert {r.info.status for r in runs} == {fp16_ending().status, "FINISHED"}


# --------------------------------------------------------------------------------------------
# the exposed server's password can be changed; a refused password is no outage


def _status_with(url: str, user: str, password: str) -> int:
    import base64
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/api/2.0/mlflow/experiments/search?max_results=1")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:  # a generous timeout: the first authenticated call hashes the password and opens the
        # store, which took over 10 s on a loaded CI machine (the answer matters here, not its speed)
        with urllib.request.urlopen(req, timeout=120) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _start_server(tmp_path: Path, port: int, password: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "SQ_MLFLOW_AUTH": "1",
           "BACKEND": f"sqlite:///{tmp_path / 'store.db'}", "ARTIFACTS": str(tmp_path / "artifacts"),
           "WORKERS": "1", "SQ_MLFLOW_STATE": str(tmp_path / "state"), "VENV": str(Path(PY).parent.parent),
           "MLFLOW_TRACKING_USERNAME": "sqadmin", "MLFLOW_TRACKING_PASSWORD": password}  # fmt: skip
    log = open(tmp_path / f"server-{port}.log", "w")  # noqa: SIM115 (the server's lifetime)
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "mlflow_server.sh")], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + SERVER_START_S
    while not _healthy(f"http://127.0.0.1:{port}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail((tmp_path / f"server-{port}.log").read_text()[-3000:])
        time.sleep(0.5)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.slow
def test_a_restarted_server_takes_the_new_password_and_refuses_the_old(tmp_path: Path) -> None:
    """Issue #25 item 7: MLflow's basic-auth app creates its admin once and ignored the password
    of a later start: the new password got 401, the old one still worked."""
    old, new = "old-password-" + os.urandom(4).hex(), "new-password-" + os.urandom(4).hex()
    port = free_port()
    proc = _start_server(tmp_path, port, old)
    try:
        assert _status_with(f"http://127.0.0.1:{port}", "sqadmin", old) == 200
    finally:
        _stop(proc)
    proc = _start_server(tmp_path, port, new)
    try:
        url = f"http://127.0.0.1:{port}"
        assert (_status_with(url, "sqadmin", new), _status_with(url, "sqadmin", old)) == (200, 401)
    finally:
        _stop(proc)
    hits = subprocess.run(["grep", "-rlaF", new, str(tmp_path)], capture_output=True, text=True)
    assert hits.returncode == 1, f"the password was written to: {hits.stdout}"


class _RefusingServer:
    """Answers /health, refuses every API call with 401: MLflow's basic auth, wrong password."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                self.send_response(200 if self.path == "/health" else 401)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_refused_password_is_an_error_not_an_outage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25 item 6: a server answering 401 was reported "unreachable" and the sweep went
    ledger-only, with nothing `make sync` could ever send. Now: exit 2, the 401 named, nothing
    written."""
    from pipeline.cli import main

    server = _RefusingServer()
    monkeypatch.setenv(redact.USER_ENV, "sqadmin")
    monkeypatch.setenv(redact.PASSWORD_ENV, "wrong-password")
    runs = tmp_path / "runs"
    try:
        rc = main(["sweep", "--sweep", "smoke", "--launcher", "local", f"runs_dir={runs}",
                   f"tracking.uri={server.uri}"])  # fmt: skip
    finally:
        server.server.shutdown()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "tracking.uri" in err and "HTTP 401" in err and "'sqadmin' was refused" in err, err
    assert "unreachable" not in err and "wrong-password" not in err
    assert not runs.exists()
