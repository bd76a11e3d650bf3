"""Memory model: hand-computed ZeRO model states, Korthikanti activations, the verdict boundaries,
advice, and a cross-check against DeepSpeed's own estimators."""

from __future__ import annotations

import re

import pytest
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import (
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_cold,
)

from pipeline.measure.flops import ModelShape, param_count
from pipeline.measure.memory import (
    CUDA_CONTEXT_BYTES,
    GIB,
    MemoryQuery,
    ModelStates,
    activation_bytes_per_device,
    advice,
    estimate,
    fit_verdict,
    logits_bytes_per_device,
    model_states_bytes_per_device,
)

P7B = 7_000_000_000  # a round 7B so that every partition divides exactly
LLAMA2_7B = ModelShape(
    n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32, ffn_hidden=11008, vocab_size=32000, seq_len=4096
)


def _states(params: float, grads: float, optimizer: float, cpu: float) -> ModelStates:
    """ModelStates from round numbers written as 14e9 (they are exact integers)."""
    return ModelStates(int(params), int(grads), int(optimizer), int(cpu))


TIERS = [("A100-80GB", 80 * GIB), ("H200", 141 * GIB), ("B200", 180 * GIB)]


def test_7b_on_8_gpus_each_stage() -> None:
    # bf16 Adam: 2 weights + 2 grads + 12 optimizer bytes/param, Psi = 7e9, Nd = 8.
    # ZeRO-0: 16 * 7e9 = 112e9
    assert model_states_bytes_per_device(P7B, 0, 8) == _states(14e9, 14e9, 84e9, 0)
    # ZeRO-1: 4Psi + 12Psi/Nd = 28e9 + 10.5e9 = 38.5e9
    assert model_states_bytes_per_device(P7B, 1, 8).device_bytes == 38_500_000_000
    # ZeRO-2: 2Psi + 14Psi/Nd = 14e9 + 12.25e9 = 26.25e9
    assert model_states_bytes_per_device(P7B, 2, 8) == _states(14e9, 1.75e9, 10.5e9, 0)
    # ZeRO-3: 16Psi/Nd = 14e9
    assert model_states_bytes_per_device(P7B, 3, 8) == _states(1.75e9, 1.75e9, 10.5e9, 0)


def test_zero_paper_figure_1() -> None:
    # ZeRO paper figure 1: Psi = 7.5B, Nd = 64, K = 12.
    # baseline 120 GB; P_os 4*7.5 + 12*7.5/64 = 31.4 GB; P_os+g 2*7.5 + 14*7.5/64 = 16.6 GB;
    # P_os+g+p 16*7.5/64 = 1.9 GB
    got = [model_states_bytes_per_device(7_500_000_000, s, 64).device_bytes / 1e9 for s in range(4)]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875])


def test_offload_and_fp32() -> None:
    # ZeRO-2 + optimizer offload: 12Psi/Nd = 10.5e9 to host, 2Psi + 2Psi/Nd = 15.75e9 stay.
    assert model_states_bytes_per_device(P7B, 2, 8, offload_optimizer=True) == _states(
        14e9, 1.75e9, 0, 10.5e9
    )
    # ZeRO-3 + both offloads: host gets 12Psi/Nd + 2Psi/Nd = 12.25e9; the grad partition stays.
    both = model_states_bytes_per_device(P7B, 3, 8, offload_optimizer=True, offload_param=True)
    assert both == _states(0, 1.75e9, 0, 12.25e9)
    # fp32: 4 + 4 + 8. ZeRO-1: 8Psi + 8Psi/Nd = 56e9 + 7e9 = 63e9; ZeRO-3: 16Psi/Nd = 14e9.
    assert model_states_bytes_per_device(P7B, 1, 8, "fp32") == _states(28e9, 28e9, 7e9, 0)
    assert model_states_bytes_per_device(P7B, 3, 8, "fp32").device_bytes == 14_000_000_000
    # Uneven partitions round up as DeepSpeed pads them: 12*10/3 = 40, 2*10/3 = 6.67 -> 7.
    assert model_states_bytes_per_device(10, 3, 3) == ModelStates(7, 7, 40, 0)


def test_invalid_configurations() -> None:
    with pytest.raises(ValueError, match="offload_optimizer"):
        model_states_bytes_per_device(P7B, 0, 8, offload_optimizer=True)
    with pytest.raises(ValueError, match="offload_param"):
        model_states_bytes_per_device(P7B, 2, 8, offload_optimizer=True, offload_param=True)
    with pytest.raises(ValueError, match="precision"):
        model_states_bytes_per_device(P7B, 2, 8, "fp8")
    with pytest.raises(ValueError, match="zero_stage"):
        model_states_bytes_per_device(P7B, 4, 8)


def test_deepspeed_zero2_estimator() -> None:
    # DeepSpeed's GPU number has no buffer factor (additional_buffer_factor multiplies only the
    # host-RAM number) and counts 18 bytes/param in the partition, not 14: the 4-byte fp32
    # gradient partition on top of 2 grads + 12 optimizer. So DS = ours + 4Psi/Nd.
    # DS: 2*7e9 + 18*7e9/8 = 14e9 + 15.75e9 = 29.75e9; ours 26.25e9 + 4*7e9/8 = 3.5e9.
    cpu, gpu = estimate_zero2_model_states_mem_needs(P7B, num_gpus_per_node=8, cpu_offload=False)
    ours = model_states_bytes_per_device(P7B, 2, 8)
    assert gpu == 29_750_000_000 == ours.device_bytes + 4 * P7B // 8
    # With offload DS keeps only the 16-bit weights (2Psi = 14e9); it streams the grad partition to
    # the host, which we keep on the device as an upper bound for the reduce buckets.
    # Host RAM per node, factor 1.5 removed: Psi*max(4*gpus, 16). At 2 GPUs/node that is 16Psi:
    # ours 2 ranks * 12Psi/2 = 12Psi, plus DeepSpeed's 4-byte fp32 grads on the host, 4Psi.
    # (At 8 GPUs/node DS's term is 4*8 = 32Psi: each process's fp32 copy of the model at init.)
    off = model_states_bytes_per_device(P7B, 2, 8, offload_optimizer=True)
    cpu, gpu = estimate_zero2_model_states_mem_needs(P7B, num_gpus_per_node=8, cpu_offload=True)
    assert gpu == 14_000_000_000 == off.device_bytes - off.grads_bytes
    cpu, _ = estimate_zero2_model_states_mem_needs(P7B, num_gpus_per_node=2, cpu_offload=True)
    off2 = model_states_bytes_per_device(P7B, 2, 2, offload_optimizer=True)
    assert cpu / 1.5 == 112e9 == 2 * off2.cpu_bytes + 4 * P7B


def test_deepspeed_zero2_all_cold_printout(capsys: pytest.CaptureFixture[str]) -> None:
    # The *_all_cold helpers print a table and return None; read the no-offload row.
    estimate_zero2_model_states_mem_needs_all_cold(P7B, num_gpus_per_node=8)
    row = next(line for line in capsys.readouterr().out.splitlines() if "offload_optimizer=none" in line)
    printed_gib = float(re.findall(r"([\d.]+)GB", row)[1])
    # (26.25e9 + 3.5e9) / 2**30 = 27.706... -> "27.71"
    ours = model_states_bytes_per_device(P7B, 2, 8).device_bytes + 4 * P7B // 8
    assert printed_gib == round(ours / GIB, 2) == 27.71


def test_deepspeed_zero3_estimator() -> None:
    # DS adds the largest layer gathered at 4 bytes/param, and counts 18 not 16 bytes/param
    # (fp32 grads), so DS = ours + 2Psi/Nd + 4*largest. Largest layer of Llama-2-7B: the
    # embedding, 32000*4096 = 131,072,000 -> 524,288,000 bytes.
    # DS: 524,288,000 + 18*7e9/8 = 15.75e9 -> 16,274,288,000; ours 14e9 + 1.75e9 + 524,288,000.
    largest = 32000 * 4096
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        P7B, largest, num_gpus_per_node=8, cpu_offload=False, cpu_offload_params=False
    )
    ours = model_states_bytes_per_device(P7B, 3, 8)
    assert gpu == 16_274_288_000 == ours.device_bytes + 2 * P7B // 8 + 4 * largest
    # Both offloads, zero_init: DS keeps only the gathered layer on the GPU (ours: the grad
    # partition, 1.75e9); host per node 18Psi*1.5 -> 18Psi = 126e9 = ours 8 ranks * 14Psi/8
    # = 14Psi = 98e9 + fp32 grads 4Psi = 28e9.
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(P7B, largest, num_gpus_per_node=8)
    both = model_states_bytes_per_device(P7B, 3, 8, offload_optimizer=True, offload_param=True)
    assert gpu == 4 * largest == both.device_bytes - both.grads_bytes + 4 * largest
    assert cpu / 1.5 == pytest.approx(126e9) == 8 * both.cpu_bytes + 4 * P7B
    # Optimizer offload only: DS GPU 4*largest + 2Psi/Nd = 524,288,000 + 1.75e9.
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        P7B, largest, num_gpus_per_node=8, cpu_offload_params=False
    )
    opt = model_states_bytes_per_device(P7B, 3, 8, offload_optimizer=True)
    assert gpu == 2_274_288_000 == opt.device_bytes - opt.grads_bytes + 4 * largest


def test_activations_korthikanti() -> None:
    # Llama-2-7B, s=4096, b=1, h=4096, a=32, L=32, 16-bit:
    # per layer s*b*h*(34 + 5*a*s/h) = 16,777,216*34 + 5*32*4096*4096 = 570,425,344 + 2,684,354,560
    #   = 3,254,779,904; 32 layers = 104,152,956,928 (97 GiB)
    acts = activation_bytes_per_device(4096, 1, 4096, 32, 32)
    assert acts == 104_152_956_928
    # Full checkpointing: 32 * 2*s*b*h = 1,073,741,824 + one layer 3,254,779,904 = 4,328,521,728
    assert activation_bytes_per_device(4096, 1, 4096, 32, 32, activation_checkpointing=True) == 4_328_521_728
    # fp32 activations double everything.
    assert activation_bytes_per_device(4096, 1, 4096, 32, 32, bytes_per_elem=4) == 2 * acts
    # Micro-batch scales linearly.
    assert activation_bytes_per_device(4096, 2, 4096, 32, 32) == 2 * acts
    # fp32 logits: 4096 * 1 * 32000 * 4 = 524,288,000
    assert logits_bytes_per_device(4096, 1, 32000) == 524_288_000


@pytest.mark.parametrize(
    ("total", "verdict"),
    [
        (0, "fits"),
        (70, "fits"),  # headroom 30/100 = 0.30 exactly: fits
        (71, "tight"),  # 0.29
        (85, "tight"),  # 0.15 exactly: tight
        (86, "does_not_fit"),  # 0.14: could start, but inside the estimate's error
        (100, "does_not_fit"),
        (120, "does_not_fit"),  # over capacity
    ],
)
def test_fit_verdict_boundaries(total: int, verdict: str) -> None:
    assert fit_verdict(total, 100) == verdict


def test_fit_verdict_boundaries_in_gib() -> None:
    # 80 GiB device: 30% headroom leaves 56 GiB, 15% leaves 68 GiB.
    cap = 80 * GIB
    assert fit_verdict(56 * GIB, cap) == "fits"
    assert fit_verdict(56 * GIB + 1, cap) == "tight"
    assert fit_verdict(68 * GIB, cap) == "tight"
    assert fit_verdict(68 * GIB + 1, cap) == "does_not_fit"
    with pytest.raises(ValueError):
        fit_verdict(1, 0)


def test_estimate_7b_zero3_8_gpus() -> None:
    q = MemoryQuery.from_shape(
        LLAMA2_7B,
        micro_batch=1,
        zero_stage=3,
        dp_ranks=8,
        capacity_bytes=80 * GIB,
        activation_checkpointing=True,
    )
    e = estimate(q)
    # Psi = 6,738,415,616; ZeRO-3: 16Psi/8 = 2Psi = 13,476,831,232
    assert e.model_states.device_bytes == 2 * param_count(LLAMA2_7B) == 13_476_831_232
    assert e.activations_bytes == 4_328_521_728
    assert e.logits_bytes == 524_288_000
    # resident 13,476,831,232 + 4,328,521,728 + 524,288,000 = 18,329,640,960
    # overhead 1 GiB 1,073,741,824 + 10% 1,832,964,096 = 2,906,705,920
    assert e.overhead_bytes == CUDA_CONTEXT_BYTES + 1_832_964_096 == 2_906_705_920
    assert e.total_bytes == 21_236_346_880
    # headroom (85,899,345,920 - 21,236,346,880) / 85,899,345,920 = 0.75278...
    assert e.headroom_frac == pytest.approx(0.752777, abs=1e-6)
    assert e.verdict == "fits"
    assert advice(q, TIERS) == []


def test_estimate_on_cpu_counts_offload_and_no_context() -> None:
    # CPU run: no CUDA context, and "offloaded" bytes live in the same RAM.
    q = MemoryQuery(
        params=1_000_000, n_layers=2, hidden=64, n_heads=4, vocab_size=100, seq_len=16, micro_batch=2,
        zero_stage=2, dp_ranks=2, capacity_bytes=10**9, precision="fp32", offload_optimizer=True, on_gpu=False,
    )  # fmt: skip
    e = estimate(q)
    # states fp32 ZeRO-2: weights 4e6 + grads 4e6/2 = 2e6 on "device", m and v 8e6/2 = 4e6 "offloaded"
    # acts fp32: 2 layers * (34*16*2*64 + 5*4*16*16*2) = 2*(69,632 + 10,240) = 159,744 -> x2 = 319,488
    # logits 16*2*100*4 = 12,800; resident 6e6 + 4e6 + 319,488 + 12,800 = 10,332,288
    # overhead 10% = 1,033,228; total 11,365,516
    assert e.activations_bytes == 319_488
    assert e.total_bytes == 11_365_516
    assert e.verdict == "fits"


def test_advice_only_what_helps() -> None:
    # Llama-2-7B, ZeRO-2 on 8 x 40 GiB, checkpointing on: 31.9 GiB, headroom 20%, tight.
    # ZeRO-3 (19.8 GiB), optimizer offload (21.5 GiB), LoRA (20.9 GiB) and an 80 GiB card fit;
    # checkpointing is already on, so it is not offered.
    q = MemoryQuery.from_shape(
        LLAMA2_7B,
        micro_batch=1,
        zero_stage=2,
        dp_ranks=8,
        capacity_bytes=40 * GIB,
        activation_checkpointing=True,
    )
    assert estimate(q).verdict == "tight"
    tips = advice(q, TIERS)
    assert [t.split(":")[0] for t in tips] == [
        "use ZeRO-3",
        "offload the optimizer state to CPU",
        "offload optimizer state and parameters to CPU (needs ZeRO-3)",
        "fine-tune an adapter (LoRA) instead of all weights",
        "move to A100-80GB (80 GiB)",
    ]
    assert all(t.split(": ")[1].startswith("fits,") for t in tips)


def test_advice_single_gpu_full_finetune() -> None:
    # One 80 GiB GPU, ZeRO-0 (16Psi = 100 GiB of states alone): a higher ZeRO stage cannot help
    # with one rank; offload (ZeRO-1 + CPU Adam) and LoRA can; the smallest card that fits is
    # not in the list (H200 would be "tight", B200 fits), so B200 is offered.
    q = MemoryQuery.from_shape(
        LLAMA2_7B,
        micro_batch=1,
        zero_stage=0,
        dp_ranks=1,
        capacity_bytes=80 * GIB,
        activation_checkpointing=True,
    )
    tips = [t.split(":")[0] for t in advice(q, TIERS)]
    assert "use ZeRO-1" not in tips and "use ZeRO-3" not in tips
    assert "offload the optimizer state to CPU (needs ZeRO-1)" in tips
    assert "fine-tune an adapter (LoRA) instead of all weights" in tips
    assert "move to B200 (180 GiB)" in tips
