"""The messages a ZeRO step sends at their real sizes (bucket_messages), by hand: a bucket of the
DeepSpeed config (or DeepSpeed's default), never larger than the tensor it carries."""

from __future__ import annotations

import pytest

from pipeline.measure.scaling import bucket_messages, comm_elem_bytes

LLAMA_7B = 6_738_415_616  # Llama-2-7B's parameters
TINY = 106_816  # model=tiny: 2 x 256 x 64 embeddings/head + 2 layers x 36,992 + a 64-wide norm


def sizes(stage: int, zero: dict, trainable: int, p: int = 2, g: int = 2, params: int | None = None) -> dict:
    return {c.op: c.size_bytes for c in bucket_messages(stage, zero, trainable, p, g, params)}


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # ZeRO-0: engine.py's MEMORY_OPT_ALLREDUCE_SIZE, 5e8 elements x 2 bytes of bf16
        (0, {"all_reduce": 1_000_000_000}),
        # ZeRO-1/2: reduce_bucket_size 5e8 x 2; the whole bf16 parameter partition all-gathered
        (1, {"all_reduce": 1_000_000_000, "all_gather": 2 * LLAMA_7B}),
        (2, {"all_reduce": 1_000_000_000, "all_gather": 2 * LLAMA_7B}),
        # ZeRO-3: stage3_prefetch_bucket_size 5e7 x 2, reduce_bucket_size 5e8 x 2
        (3, {"all_gather": 100_000_000, "reduce_scatter": 1_000_000_000}),
    ],
)
def test_a_7b_model_at_deepspeeds_default_buckets(stage: int, expected: dict) -> None:
    assert sizes(stage, {"stage": stage}, LLAMA_7B) == expected


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_model_under_the_bucket_goes_whole(stage: int) -> None:
    whole = TINY * 4  # fp32: 427,264 bytes
    assert set(sizes(stage, {}, TINY, 4, 4).values()) == {whole}


def test_configured_buckets_cap_the_messages() -> None:
    zero = {"reduce_bucket_size": 200_000_000, "stage3_prefetch_bucket_size": 10_000_000}
    assert sizes(2, zero, LLAMA_7B) == {"all_reduce": 400_000_000, "all_gather": 2 * LLAMA_7B}
    assert sizes(3, zero, LLAMA_7B) == {"all_gather": 20_000_000, "reduce_scatter": 400_000_000}
    # a cap above the model: the model, not the cap
    assert sizes(3, {"reduce_bucket_size": 10**12}, TINY, 4, 4) == {
        "all_gather": 427_264,
        "reduce_scatter": 427_264,
    }


def test_allgather_bucket_size_does_not_split_zero_1_2s_all_gather() -> None:
    """DeepSpeed 0.19 all-gathers the flat partition with all_gather_into_tensor (runtime/utils.py)."""
    assert sizes(1, {"allgather_bucket_size": 1000}, LLAMA_7B)["all_gather"] == 2 * LLAMA_7B


def test_without_multi_rank_bucket_allreduce_the_buckets_are_reduced() -> None:
    got = sizes(2, {"use_multi_rank_bucket_allreduce": False}, LLAMA_7B)
    assert got == {"reduce": 1_000_000_000, "all_gather": 2 * LLAMA_7B}


def test_no_prefetch_bucket_leaves_zero_3s_all_gather_absent() -> None:
    """Prefetch 0: one module at a time, a size a parameter count does not give."""
    assert sizes(3, {"stage3_prefetch_bucket_size": 0}, LLAMA_7B) == {"reduce_scatter": 1_000_000_000}


def test_lora_reduces_the_adapters_and_zero_3_gathers_every_parameter() -> None:
    adapters = 4_194_304  # rank 8 on q and v of Llama-2-7B: 32 layers x 2 x 8 x (4096 + 4096)
    got = sizes(3, {}, adapters, params=LLAMA_7B)
    assert got == {"all_gather": 100_000_000, "reduce_scatter": 2 * adapters}
    assert sizes(2, {}, adapters, params=LLAMA_7B) == {"all_reduce": 2 * adapters, "all_gather": 2 * adapters}


def test_fp32_gradients_of_a_bf16_model() -> None:
    assert comm_elem_bytes({"bf16": {"enabled": True}}) == (2, 2)
    assert comm_elem_bytes({"fp16": {"enabled": True}, "bf16": {"enabled": False}}) == (2, 2)
    assert comm_elem_bytes({"bf16": {"enabled": False}}) == (4, 4)
    assert comm_elem_bytes({"bf16": {"enabled": True}, "communication_data_type": "fp32"}) == (2, 4)
    assert sizes(2, {}, TINY, 2, 4) == {"all_reduce": TINY * 4, "all_gather": TINY * 2}


@pytest.mark.parametrize(
    ("stage", "zero", "trainable"),
    [(4, {}, TINY), (-1, {}, TINY), (1, {}, -5), (1, {}, 1.5), (2, {"reduce_bucket_size": 0}, TINY)],
)
def test_bad_input(stage: int, zero: dict, trainable: int) -> None:
    with pytest.raises(ValueError):
        bucket_messages(stage, zero, trainable, 2, 2)


def test_the_plan_of_a_point_is_its_deepspeed_config() -> None:
    """validate.bucket_plan: build_ds_config's config (no bucket settings: DeepSpeed's defaults),
    the tiny model's 106,816 parameters in fp32 and bf16."""
    from pipeline.config.validate import bucket_plan
    from tests.support.helpers import compose

    plan = bucket_plan(compose(["model=tiny", "precision=fp32", "parallelism=zero3"]))
    assert {c.op: c.size_bytes for c in plan} == {"all_gather": 427_264, "reduce_scatter": 427_264}
    plan = bucket_plan(compose(["model=tiny", "precision=bf16", "parallelism=zero2"]))
    assert {c.op: c.size_bytes for c in plan} == {"all_reduce": 213_632, "all_gather": 213_632}


def test_the_memory_check_counts_the_probes_largest_message() -> None:
    """llama-1b in bf16 at ZeRO-2: its all-gather is the whole partition, 1,235,814,400 x 2 bytes
    (model=llama-1b's parameters as the estimate counts them), twice that in buffers (4.6 GiB).
    The probe runs before the model is built and frees its buffers, so they need a rank's memory,
    not room beside the model: refused on a 4 GiB rank, accepted on a 54 GiB rank the model
    nearly fills (50.9 GiB)."""
    from pipeline.config.validate import bucket_plan, comm_problems, memory_estimate
    from tests.support.helpers import compose

    over = ["model=llama-1b", "precision=bf16", "parallelism=zero2", "partition.gpu_mem_gib=4"]
    cfg = compose(over)
    assert {c.op: c.size_bytes for c in bucket_plan(cfg)}["all_gather"] == 2_471_628_800
    (problem,) = comm_problems(cfg)
    assert problem.startswith("train.measure_comm=true") and "all_gather" in problem and "2472 MB" in problem
    assert "allowed: train.measure_comm=false" in problem and "4.6 GiB per rank" in problem
    assert comm_problems(compose([*over, "train.measure_comm=false"])) == []
    full = compose([*over[:-1], "partition.gpu_mem_gib=54"])
    e = memory_estimate(full)
    assert e.total_bytes + 2 * 2_471_628_800 > e.capacity_bytes > 2 * 2_471_628_800  # not beside it
    assert comm_problems(full) == []
