"""The clients people use, recorded on an H200 under ``shardtop run`` (``tests/fixtures/runs/h200-clients``,
made by ``gpu/record.sh clients``): HF Trainer and ``accelerate launch`` with DeepSpeed ZeRO-3 and with
FSDP, peft LoRA under both, ``torch.compile`` under FSDP2 and Lightning's ``bf16-true`` under FSDP, each on
one GPU.

Each report states the steps the script took (5), its engine, the bytes the rank holds of a model whose
size the script fixes, and the findings a user would want; the memory split explains the peak, cuBLAS's
two workspaces as their own kind.  Their commands planned again against these peaks:
``tests/engines/test_client_plans.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import report

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h200-clients"
MiB = 1 << 20
LLAMA = 168_313_856
"""``HF_TINY_SIZE=gpu``'s Llama: hidden 1024, 8 layers, MLP 2816, vocabulary 32 000, untied head."""
LORA = 131_072
"""peft's adapters on q_proj and v_proj, rank 4: 8 layers x 2 projections x 4 x (1024 + 1024)."""
TINY_GPT = 216_722_688
"""``lightning_deepspeed_user.py``'s model: width 1024, 12 blocks, vocabulary 32 000."""

CASES: dict[str, tuple[str, int, int, list[str]]] = {
    # name: engine, parameter bytes the rank holds, gradient bytes, findings
    "hf-trainer-zero3": ("zero3", 4 * LLAMA, 4 * LLAMA, ["zero3-single-rank", "optimizer-state-dominates"]),
    "accelerate-zero3": ("zero3", 4 * LLAMA, 4 * LLAMA, ["zero3-single-rank", "optimizer-state-dominates"]),
    "hf-trainer-fsdp": ("fsdp2", 4 * LLAMA, 4 * LLAMA, ["fsdp-single-rank", "optimizer-state-dominates"]),
    "accelerate-fsdp2": ("fsdp2", 4 * LLAMA, 4 * LLAMA, ["fsdp-single-rank", "optimizer-state-dominates"]),
    "peft-lora-zero3": ("zero3", 4 * (LLAMA + LORA), 4 * LORA, ["zero3-single-rank"]),
    "peft-lora-fsdp2": ("fsdp2", 4 * (LLAMA + LORA), 4 * LORA, ["fsdp-single-rank"]),
    "lightning-bf16-true": ("fsdp1", 2 * TINY_GPT, 2 * TINY_GPT, ["fsdp-single-rank", "optimizer-state-dominates"]),
}


def recording(name: str) -> Path:
    found = [p for p in sorted(RECORDINGS.iterdir()) if p.is_dir() and p.name[16:-5] == name]
    assert len(found) == 1, (name, found)
    return found[0]


def json_report(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(report(recording(name), "json"))
    return data


@pytest.mark.parametrize("name", [*CASES, "compile-fsdp2"])
def test_each_client_reads_its_steps_engine_and_memory(name: str) -> None:
    data = json_report(name)
    rank = data["ranks"][0]
    assert data["step"] == rank["step"] == 5, "five optimizer steps, each counted once"
    split, peak = rank["memory_peak"], rank["allocator"]["peak"]
    assert split["allocated"] >= 0.99 * peak, "the split is of the peak: within 1 % of the allocator's"
    assert split["allocated"] - max(split["unexplained"], 0) >= 0.999 * split["allocated"], "99.9 % explained"
    assert split["by_kind"]["workspace"] == 2 * 32 * MiB, "cuBLAS's workspaces: the forward's and autograd's"
    assert not any("_orig_mod" in m["path"] for m in data["modules"])
    if name in CASES:
        engine, param_bytes, grad_bytes, findings = CASES[name]
        assert data["engine"] == engine
        assert (rank["param_bytes"], rank["grad_bytes"]) == (param_bytes, grad_bytes)
        assert [f["code"] for f in data["findings"]] == findings


def test_lora_trains_only_its_adapters() -> None:
    """ZeRO-3's optimizer state per trained parameter: the fp32 master and Adam's two moments, 12 bytes."""
    lora, full = json_report("peft-lora-zero3")["ranks"][0], json_report("hf-trainer-zero3")["ranks"][0]
    assert (lora["optim_bytes"], full["optim_bytes"]) == (12 * LORA, 12 * LLAMA)
