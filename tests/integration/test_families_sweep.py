"""Any causal-LM family, end to end (issue #23): one local sweep over small random-weight
`save_pretrained` folders of the eight families tests/unit/test_describe.py describes, plus bloom, a
family no other test uses (fused query_key_value, ALiBi, no SDPA attention in transformers), and
phimoe (issue #46: routed experts whose router is an nn.Linear returning a tuple, once refused
with a false reason), each with method=full, lora and qlora. Every point reaches an outcome of its own (accepted, or failed for
the candidate's reason: never a crash or the tool's error), with MFU logged, the parameters the
model really has, and its shape as built, checked against the folder itself and against peft; each
full run's logged FLOPs per token against FlopCounterMode on the family's own class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.contract.outcome import Outcome, Reason
from pipeline.tracking import keys as K
from tests.support.families import FAMILIES, SMALL, all_linear, save_family
from tests.support.helpers import point_runs, qualify

UNSEEN = "bloom"
ROUTER_LINEAR = "phimoe"
METHODS = ("full", "lora", "qlora")
RANK = 8  # method.lora_rank's default


def _save_bloom(folder: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(UNSEEN, vocab_size=SMALL["vocab_size"], hidden_size=64, n_layer=2, n_head=4)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(hf).save_pretrained(folder)
    return folder


# FlopCounterMode on the meta device: not through routed experts (their routing reads values)
COUNTED = [f for f in FAMILIES if f not in ("mixtral", ROUTER_LINEAR)]


def _counted(folder: Path, seq_len: int) -> float:
    from tests.support.flop_counter import counted_flops_of_folder

    return counted_flops_of_folder(folder, seq_len)


def _reference(folder: Path, family: str) -> dict[str, Any]:
    """What the folder holds, from transformers and peft, not from the pipeline: the parameter
    count of the model as built, the adapters peft trains on it, and the shape in config.json."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    params = sum(p.numel() for p in model.parameters())
    targets = "all-linear" if family == UNSEEN else all_linear(family)  # the job's, router-free
    lora = LoraConfig(r=RANK, target_modules=targets, fan_in_fan_out=family == "gpt2")
    adapters = get_peft_model(model, lora).get_nb_trainable_parameters()[0]
    return {
        "params": params,
        "adapters": adapters,
        "config": json.loads((folder / "config.json").read_text()),
    }


@pytest.mark.slow
@pytest.mark.long(306)  # 266 s measured in CI before phimoe; its three points add about 40 s here
@pytest.mark.timeout(2400)
def test_a_sweep_over_ten_families_reaches_an_outcome_for_every_point(
    tmp_path: Path, sqlite_uri: str
) -> None:
    folders = {f: save_family(tmp_path / f, f) for f in FAMILIES}
    folders[UNSEEN] = _save_bloom(tmp_path / UNSEEN)
    folders[ROUTER_LINEAR] = save_family(tmp_path / ROUTER_LINEAR, ROUTER_LINEAR)
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--wait",
            "model.pretrained=" + ",".join(str(p) for p in folders.values()),
            "method=" + ",".join(METHODS),
            "parallelism.gpus_per_node=1",
            "launcher.local_parallelism=2",
            "train.steps=4",
            "health.enabled=false",
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.uri={sqlite_uri}",
        ],
        timeout=2300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = point_runs(sqlite_uri)
    assert len(runs) == len(folders) * len(METHODS), res.stdout[-3000:]
    seen: set[tuple[str, str]] = set()
    for r in runs:
        folder = Path(r.data.params["model.pretrained"])
        family, method = folder.name, r.data.params["method.name"]
        seen.add((family, method))
        ref = _reference(folder, family)
        tags, m, params = r.data.tags, r.data.metrics, r.data.params
        where = (family, method, tags.get(K.TAG_REASON), tags.get(K.TAG_REASON_DETAIL))
        assert tags[K.TAG_OUTCOME] in (Outcome.ACCEPTED, Outcome.FAILED), where
        assert tags.get(K.TAG_REASON) not in (Reason.CRASH, Reason.TOOL_ERROR), where
        assert m[K.PERF_MFU_VS_CEILING] > 0, where  # MFU from the described FLOPs
        assert m[K.PERF_MODEL_FLOPS_PER_TOKEN] > 0, where
        assert params["model.family"] == ref["config"]["model_type"], where
        assert int(params["model.vocab_size"]) == ref["config"]["vocab_size"], where
        if method == "full":
            assert m[K.TRAIN_PARAMS] == ref["params"], where  # every parameter of the built model
            assert m[K.TRAIN_TRAINABLE_PARAMS] == ref["params"], where
            if family in COUNTED:  # the FLOPs the run logged, against torch's counter
                counted = _counted(folder, int(params["model.seq_len"]))
                assert m[K.PERF_MODEL_FLOPS_PER_TOKEN] == pytest.approx(counted, rel=0.01), where
        else:
            assert m[K.TRAIN_TRAINABLE_PARAMS] == ref["adapters"], where  # peft's own count
    assert seen == {(f, m) for f in folders for m in METHODS}


def test_the_login_node_describes_a_folder_in_a_helper_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process without pipeline.train (the login node's qualify) describes in a helper process
    (here: a second process importing transformers, so not in the unit suite); one that has it
    loaded (this one, a job's rank) describes in-process, to the same JSON."""
    from pipeline.config import pretrained
    from pipeline.config.pretrained import describe
    from pipeline.measure.describe import ModelDescription
    from pipeline.train.describe import describe_request
    from tests.support.helpers import compose

    save_family(tmp_path / "neox", "gpt_neox")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "_IN_PROCESS", [])  # as on the login node
    helper_calls: list[object] = []
    run_helper = pretrained._run_helper
    monkeypatch.setattr(pretrained, "_run_helper", lambda *a: helper_calls.append(a) or run_helper(*a))
    cfg = compose([f"model.pretrained={tmp_path / 'neox'}", "model.seq_len=32"])
    d = describe(cfg.model)
    assert len(helper_calls) == 1
    assert d.family == "gpt_neox" and d.folder == str((tmp_path / "neox").resolve())
    assert d.config_sha256 and len(d.config_sha256) == 64
    assert describe(cfg.model) is d  # cached
    request, _ = pretrained._request(cfg.model, None)
    here = describe_request(request)
    assert ModelDescription.from_json(here) == d and len(helper_calls) == 1
