"""Bad input, as a careless or hostile user types it: every case goes through the real
`qualify sweep` (in process, a few as a subprocess) and must be refused with exit code 2 and one
paragraph naming the key and what is allowed, before anything is written, logged or submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from tests.support.helpers import qualify

KP = ["train.checkpoint_interval=5"]  # what drill=kill_worker needs to compose at all

# (overrides, the key the message must name, what the message must say is allowed)
CASES: list[tuple[list[str], str, str]] = [
    # numbers: finite, sign, minimum, sane maximum (issue 14 item 10)
    (["train.lr=inf"], "train.lr", "finite number > 0"),
    (["train.lr=nan"], "train.lr", "finite number > 0"),
    (["train.lr=-0.1"], "train.lr", "finite number > 0"),
    (["train.lr=abc"], "train.lr", "converted to Float"),
    (["tracking.flush_every_s=0"], "tracking.flush_every_s", ">= 0.1"),
    (["train.pg_timeout_s=-5"], "train.pg_timeout_s", ">= 1"),
    (["train.comm_sizes_mb=[-1]"], "train.comm_sizes_mb", "> 0"),
    (["train.comm_sizes_mb=[]"], "train.comm_sizes_mb", "at least one size"),
    (["launcher.max_restarts=-1"], "launcher.max_restarts", ">= 0"),
    (["launcher.max_num_timeout=-1"], "launcher.max_num_timeout", ">= 0"),
    (["launcher.signal_delay_s=0"], "launcher.signal_delay_s", ">= 1"),
    (["launcher.signal_delay_s=3600"], "launcher.signal_delay_s", "partition.time_limit_min x 60 = 1800"),
    (["partition.cpus_per_task=0"], "partition.cpus_per_task", ">= 1"),
    (["partition=h100", "partition.gpu_mem_gib=-80"], "partition.gpu_mem_gib", ">= 0"),
    (["partition.mem_gb_per_node=0"], "partition.mem_gb_per_node", "> 0"),
    (["partition.time_limit_min=0"], "partition.time_limit_min", ">= 1"),
    (["partition.price_usd_per_gpu_hour=-1"], "partition.price_usd_per_gpu_hour", ">= 0"),
    (["partition=h100", "partition.peak_tflops.bf16=-1"], "partition.peak_tflops.bf16", "> 0"),
    (["partition.price_date=yesterday"], "partition.price_date", "YYYY-MM-DD"),
    (["cost.egress_usd_per_gb=-0.1"], "cost.egress_usd_per_gb", ">= 0"),
    (["cost.labor_usd_per_hour=inf"], "cost.labor_usd_per_hour", "finite"),
    (["drill=preempt", "drill.loss_tolerance=-1"], "drill.loss_tolerance", ">= 0"),
    (["drill=timeout", "drill.timeout.time_limit_min=0"], "drill.timeout.time_limit_min", ">= 1"),
    (["drill=timeout", "drill.timeout.signal_delay_s=120"], "drill.timeout.signal_delay_s", "below"),
    (["drill=timeout", "drill.timeout.step_floor_s=-1"], "drill.timeout.step_floor_s", ">= 0"),
    (["drill=timeout", "drill.timeout.step_floor_s=nan"], "drill.timeout.step_floor_s", "finite"),
    (["drill=timeout", "drill.timeout.step_floor_s=61"], "drill.timeout.step_floor_s", "<= 60"),
    (["drill=kill_worker"], "train.checkpoint_interval", "> 0 with drill=kill_worker"),
    (["drill=kill_worker", *KP, "drill.kill_worker.rank=-1"], "drill.kill_worker.rank", ">= 0"),
    (["drill=reshape", "drill.reshape.world_size=0"], "drill.reshape.world_size", ">= 1"),
    (["drill=checkpoint", "drill.checkpoint.at_step=50"], "drill.checkpoint.at_step", "[1, train.steps=20)"),
    (["drill=preempt", "drill.preempt.trigger=bomb"], "drill.preempt.trigger", "signal | urgent"),
    (["train.steps=1000000000000"], "train.steps", "[1, 1e+07]"),
    (["train.warmup_steps=20"], "train.warmup_steps", "< train.steps"),
    (["train.seed=-1"], "train.seed", "[0, 2**32)"),
    (["train.loss_bound_frac=1.5"], "train.loss_bound_frac", "<= 1"),
    (["train.keep_last=0"], "train.keep_last", ">= 1"),
    (["train.grad_clip=-1"], "train.grad_clip", ">= 0"),
    (["train.checkpoint_io=mmap"], "train.checkpoint_io", "direct | buffered | deepspeed"),
    (["model.seq_len=1"], "model.seq_len", ">= 2"),
    (["model.n_kv_heads=3"], "model.n_kv_heads", "a divisor of model.n_heads"),
    (["parallelism.zero_stage=5"], "parallelism.zero_stage", "0, 1, 2 or 3"),
    (["parallelism.micro_batch=0"], "parallelism.micro_batch", ">= 1"),
    # the folder a sweep writes into (issue 14 items 9 and 10)
    (["runs_dir=/etc"], "runs_dir", "not / or a system path"),
    (["runs_dir=/"], "runs_dir", "not / or a system path"),
    (["runs_dir=''"], "runs_dir", "not empty"),
    (["runs_dir=/usr/local/runs"], "runs_dir", "not / or a system path"),
    (["runs_dir=../../../../../../../../../../proc/x"], "runs_dir", "outside the system's folders"),
    (["runs_dir={tmp}/a_file/runs"], "runs_dir", "a folder you can write"),
    # tracking (issue 14 item 9)
    (["tracking.experiment=''"], "tracking.experiment", "not empty"),
    (["tracking.experiment='   '"], "tracking.experiment", "not empty"),
    (["tracking.uri=file:///tmp/mlruns"], "tracking.uri", "sqlite:///<path>"),
    (["tracking.uri=/tmp/mlruns"], "tracking.uri", "sqlite:///<path>"),
    # strings that reach an sbatch script or a shell (issue 14 item 7)
    (
        ["partition.account='acct\n#SBATCH --uid=0\ntouch x'"],
        "partition.account",
        "without control characters",
    ),
    (["partition.account='acct\\n#SBATCH --uid=0'"], "partition.account", "Slurm name"),
    (["partition.qos='normal;rm -rf x'"], "partition.qos", "Slurm name"),
    # handed to every Slurm client as `-M <name>` and to sbatch as --clusters
    (["partition.slurm_cluster='-M all'"], "partition.slurm_cluster", "Slurm name"),
    (["partition.slurm_cluster='c2;id'"], "partition.slurm_cluster", "Slurm name"),
    (["partition.slurm_partition='a100 --uid=0'"], "partition.slurm_partition", "Slurm partition names"),
    (["partition.constraint='a100$(id)'"], "partition.constraint", "Slurm features"),
    (["partition.gpu_type='a100\rX'"], "partition.gpu_type", "without control characters"),
    (["partition.setup=['module load x\nrm -rf y']"], "partition.setup", "without control characters"),
    (["tracking.uri='sqlite:///x.db\n'"], "tracking.uri", "without control characters"),
    (["model.name='tiny/../../x'"], "model.name", "letters, digits"),
    # override syntax (issue 14 items 5, 6 and 9)
    (["train.lr=é"], "train.lr=é", "quote a value"),
    (
        ["data=text", "data.path={tmp}/in/corpus.jsonl", "data.tokenizer={tmp}/in/cut_tokenizer"],
        "data.tokenizer",
        "tokenizer.json cannot be read",
    ),
    (
        ["data=text", "data.path={tmp}/in/corpus.jsonl", "data.tokenizer={tmp}/in/bad_tok_config"],
        "data.tokenizer",
        "tokenizer_config.json is no JSON object",
    ),
    (
        ["data=text", "data.path={tmp}/in/corpus.jsonl", "data.tokenizer={tmp}/in/list_tok_config"],
        "data.tokenizer",
        "tokenizer_config.json is no JSON object (a JSON list)",
    ),
    # a byte that is not UTF-8 (argv keeps it as a lone surrogate) inside a quoted free-text value
    # (issue 47, case 11: a UnicodeEncodeError traceback when the config was written)
    (["partition.setup=['echo \udcff']"], "partition.setup", "byte 0xff"),
    (["tracking.experiment='a\udce9b'"], "tracking.experiment", "byte 0xe9"),
    (["sweep.description='d\udce9j\udce0'"], "sweep.description", "which is not UTF-8"),
    (["+train.foo=1"], "train.foo", "Keys there"),
    (["++train.foo=1"], "train.foo", "Keys there"),
    (["+train.steps=5"], "train.steps", "train.steps=<value>"),
    (["~train.lr"], "train.lr", "set 'train.lr' to a value"),
    (["parallelism.zero_stag=2"], "parallelism.zero_stag", "Did you mean 'parallelism.zero_stage'"),
    (["drill=[checkpoint,bogus]"], "bogus", "Available options: checkpoint, kill_worker, none"),
    (["model=gpt5"], "model/gpt5", "Available options"),
    (["precision=fp12"], "precision/fp12", "bf16"),
    (["launcher.kind=pbs"], "launcher.kind", "auto | local | slurm"),
    # ---- issue 25 -------------------------------------------------------------------------
    # a GPU partition on the local launcher of a machine without that GPU (item 3)
    *(
        ([f"partition={gpu}"], f"partition={gpu}", "partition=local")
        for gpu in ("a100", "h100", "h200", "b200", "l40s")
    ),
    (["partition=a100", "precision=bf16"], "partition=a100", "recorded as a100"),
    (["partition.gpu_type=h100", "partition.gpus_per_node=8"], "partition.gpu_type=h100", "partition=local"),
    # secrets the user marks (item 4)
    (["tracking.secrets=[abc]"], "tracking.secrets", "at least 4 characters"),
    (["tracking.secrets=['']"], "tracking.secrets", "at least 4 characters"),
    # tracebacks that are refusals now (item 5)
    (["train.seed=range(0,0)"], "train.seed", "at least one value"),
    (["train.seed=range(5,5)"], "train.seed", "at least one value"),
    (["train.lr=range(1,1)"], "train.lr", "at least one value"),
    (["train.seed=range(10,0)"], "train.seed", "at least one value"),
    (["model.pretrained={tmp}/in/list_config"], "model.pretrained", "a JSON object"),
    (["model.pretrained={tmp}/in/string_config"], "model.pretrained", "a JSON object"),
    (["model.pretrained={tmp}/in/null_config"], "model.pretrained", "a JSON object"),
    (["model.pretrained={tmp}/in/bad_json"], "model.pretrained", "cannot be read as JSON"),
    (["model.pretrained={tmp}/in"], "model.pretrained", "has no config.json"),
    (["model.pretrained={tmp}/a_file"], "model.pretrained", "is not a folder"),
    # settings that cannot work (item 6)
    (["tracking.uri=sqlite:///"], "tracking.uri", "names no file"),
    (["tracking.uri=sqlite://"], "tracking.uri", "names no file"),
    (["tracking.uri=sqlite:////tmp/"], "tracking.uri", "names no file"),
    (["tracking.uri=http://"], "tracking.uri", "with a host name"),
    (["tracking.uri=https://"], "tracking.uri", "with a host name"),
    (["tracking.uri=http://:5000"], "tracking.uri", "with a host name"),
    (["tracking.uri=http://host:99999"], "tracking.uri", "a port in 1-65535"),
    (["tracking.uri=http://host:port"], "tracking.uri", "a port in 1-65535"),
    (["tracking.uri=http://user:pw-Zq8v@:5000"], "tracking.uri", "with a host name"),
    (["tracking.uri=ftp://host/x"], "tracking.uri", "sqlite:///<path>"),
    (["tracking.experiment=" + "x" * 501], "tracking.experiment", "at most 500 characters"),
    (["tracking.experiment=" + "é" * 600], "tracking.experiment", "quote a value"),
    (["tracking.experiment='" + "long name " * 60 + "'"], "tracking.experiment", "at most 500 characters"),
    (
        ["train.comm_sizes_mb=[65536]", "partition.gpu_mem_gib=8"],
        "train.comm_sizes_mb",
        "fits in a rank's memory",
    ),
    (
        ["train.comm_sizes_mb=[1,4,4096]", "partition.gpu_mem_gib=4"],
        "train.comm_sizes_mb",
        "fits in a rank's memory",
    ),
    (["train.comm_sizes_mb=[100000]"], "train.comm_sizes_mb", "<= 65536"),
    (
        ["drill=kill_worker", "train.checkpoint_interval=1000"],
        "train.checkpoint_interval",
        "drill.kill_worker.at_step=12",
    ),
    (["drill=kill_worker", "train.checkpoint_interval=12"], "train.checkpoint_interval", "no checkpoint"),
    (["drill=kill_worker", *KP, "drill.kill_worker.at_step=5"], "train.checkpoint_interval", "fewer steps"),
    (["drill=kill_worker", *KP, "drill.kill_worker.at_step=3"], "train.checkpoint_interval", "fewer steps"),
    (
        ["drill=timeout", "drill.timeout.time_limit_min=100000"],
        "drill.timeout.time_limit_min",
        "can never fire",
    ),
    (
        ["drill=timeout", "drill.timeout.time_limit_min=30"],
        "drill.timeout.time_limit_min",
        "partition.time_limit_min=30",
    ),
    (["drill=timeout", "partition.time_limit_min=2"], "drill.timeout.time_limit_min", "fewer minutes"),
    (
        ["drill=preempt", "drill.preempt.trigger=urgent"],
        "drill.preempt.trigger=urgent",
        "trigger=local or signal",
    ),
    (
        ["drill=preempt", "drill.preempt.trigger=requeue"],
        "drill.preempt.trigger=requeue",
        "trigger=local or signal",
    ),
    (
        ["drill=[checkpoint,preempt]", "drill.preempt.trigger=urgent"],
        "drill.preempt.trigger=urgent",
        "needs Slurm",
    ),
    (["data.path=/tmp/train.bin"], "data.path", "null with data=synthetic"),
    (["data.tokenizer=/tmp/tok"], "data.tokenizer", "null with data=synthetic"),
    (["data=synthetic", "data.path={tmp}/a_file"], "data.path", "data=tokens"),
    (["train.seed=range(0,100000)"], "launcher.max_points", "launcher.max_points=100000"),
    (["train.seed=range(0,1001)"], "launcher.max_points", "narrow the grid"),
    (
        ["train.seed=range(0,20)", "launcher.max_points=10"],
        "launcher.max_points",
        "at most launcher.max_points",
    ),
    (["launcher.max_points=0"], "launcher.max_points", ">= 1"),
    (
        ["drill=kill_worker", *KP, "drill.kill_worker.at_step=3", "launcher.max_restarts=1"],
        "train.checkpoint_interval",
        "max_restarts=0",
    ),
    # wrong refusal texts (item 9)
    (["data=tokens", "data.path=/dev/zero"], "data.path", "not a regular file"),
    (["data=tokens", "data.path={tmp}/in"], "data.path", "is a folder"),
    (["data=tokens", "data.path={tmp}/in/missing.bin"], "data.path", "no such token file"),
    (["method=lora", "method.target_modules=[lm_head]"], "lm_head", "outside the transformer blocks"),
    (
        ["method=lora", "method.target_modules=[embed_tokens]"],
        "embed_tokens",
        "outside the transformer blocks",
    ),
    (
        ["method=lora", "method.target_modules=[q_proj,attn]"],
        "method.target_modules",
        "the llama model has no linear layer named attn",
    ),
]


def _ids(case: tuple[list[str], str, str]) -> str:
    return " ".join(case[0]).encode("unicode_escape").decode()[:60]


@pytest.fixture
def nothing_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the sweep gets as far as submitting or creating an MLflow run."""
    import pipeline.submit.manifest
    import pipeline.submit.sweep

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("bad input reached submission")

    monkeypatch.setattr(pipeline.submit.sweep, "submit", refuse)
    monkeypatch.setattr(pipeline.submit.sweep, "create_parent_run", refuse)
    monkeypatch.setattr(pipeline.submit.manifest, "create_parent_run", refuse)


TOKENIZER_JSON = (
    '{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":'
    '{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":'
    '{"<unk>":0,"</s>":1,"a":2},"unk_token":"<unk>"}}'
)
INPUTS = {  # files the cases point at, under {tmp}/in: a model folder each
    "list_config/config.json": "[1, 2, 3]",
    "string_config/config.json": '"llama"',
    "null_config/config.json": "null",
    "bad_json/config.json": "{model_type: llama",
    # issue 47, case 6: tokenizer folders whose files are damaged (a traceback, exit 1, before)
    "corpus.jsonl": '{"text": "a a a"}\n',
    "cut_tokenizer/tokenizer.json": '{"version":"1.0","truncation":null,"padding":null,"added_tok',
    "bad_tok_config/tokenizer.json": TOKENIZER_JSON,
    "bad_tok_config/tokenizer_config.json": '{"eos_token": "</s>", ',
    "list_tok_config/tokenizer.json": TOKENIZER_JSON,
    "list_tok_config/tokenizer_config.json": '["</s>"]',
}


def _args(tmp: Path, overrides: list[str]) -> tuple[Path, Path, list[str]]:
    runs, db = tmp / "runs", tmp / "m.db"
    (tmp / "a_file").write_text("a file where a folder is asked for\n")
    for name, text in INPUTS.items():
        (tmp / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "in" / name).write_text(text)
    ovs = [o.replace("{tmp}", str(tmp)) for o in overrides]
    base = [
        "sweep",
        "--sweep",
        "smoke",
        "--launcher",
        "local",
        f"runs_dir={runs}",
        f"tracking.uri=sqlite:///{db}",
    ]
    return runs, db, [*base, *ovs]


def _assert_refused(tmp: Path, runs: Path, db: Path, rc: int, err: str, key: str, allowed: str) -> None:
    assert rc == 2, err
    assert err.startswith("error: "), err
    assert "\n\n" not in err.strip(), f"more than one paragraph: {err}"
    assert key in err, f"the message does not name {key!r}: {err}"
    assert allowed in err, f"the message does not say {allowed!r} is allowed: {err}"
    assert "Traceback" not in err
    assert not runs.exists(), "a sweep folder was written for bad input"
    assert not db.exists(), "the MLflow store was created for bad input"
    assert sorted(p.name for p in tmp.iterdir()) == ["a_file", "in"], "something was written"
    inputs = sorted(str(p.relative_to(tmp / "in")) for p in (tmp / "in").rglob("*") if p.is_file())
    assert inputs == sorted(INPUTS), "something was written next to the inputs"


def test_the_table_has_a_hundred_and_twenty_cases() -> None:
    assert len(CASES) >= 120
    assert len({tuple(c[0]) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("overrides,key,allowed", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.usefixtures("nothing_submitted")
def test_bad_input_is_refused_before_anything_happens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], key: str, allowed: str
) -> None:
    runs, db, args = _args(tmp_path, overrides)
    rc = main(args)
    out = capsys.readouterr()
    assert out.out == "", "nothing is announced for bad input"
    _assert_refused(tmp_path, runs, db, rc, out.err, key, allowed)


SUBPROCESS = [
    CASES[0],  # train.lr=inf
    next(c for c in CASES if "\n#SBATCH" in c[0][0]),  # a newline in partition.account
    next(c for c in CASES if c[0] == ["train.lr=é"]),  # unquoted unicode
]


@pytest.mark.parametrize("overrides,key,allowed", SUBPROCESS, ids=[_ids(c) for c in SUBPROCESS])
def test_bad_input_is_refused_by_the_command(
    tmp_path: Path, overrides: list[str], key: str, allowed: str
) -> None:
    """The same through the installed command line, as a user runs it (argv, exit status)."""
    runs, db, args = _args(tmp_path, overrides)
    res = qualify(args, timeout=120)
    _assert_refused(tmp_path, runs, db, res.returncode, res.stderr, key, allowed)
