"""TRL's ``SFTTrainer`` with TRL's own ``zero3.yaml`` (bf16) on an H100, recorded on 2026-12-07
(``tests/fixtures/runs/h100-trl``, ``gpu/record.sh trl_zero3``: trl 1.16.0, datasets 4.8.0,
accelerate 1.15, transformers 5.17, DeepSpeed 0.19.8, torch 2.11): ``tests/frameworks/trl_sft.py --cuda``
alone, under ``shardtop run`` and rehearsed as ranks 0 and 7 of eight.

- under ``shardtop run`` it ends as it did alone: the same steps and the same last loss, to the digit;
- the report reads ZeRO-3, its three steps and the model's parameters;
- both rehearsed ranks finish their steps holding the same bytes, and the world of eight is said.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.support.cli import report

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h100-trl"
UNDER_RUN = RECORDINGS / "20261207-014814-trl-zero3-66f5"
REHEARSED = RECORDINGS / "20261207-014855-trl_sft-7a61"
FINAL = re.compile(r"^final steps=(\d+) loss=(\S+) distributed_type=(\w+)$", re.MULTILINE)


def _alone_output() -> str:
    """What the command printed alone, as the record's log kept it."""
    log = (RECORDINGS / "record.log").read_text()
    return log[log.index("=== TRL zero3 alone") : log.index("=== TRL zero3 under shardtop run")]


def test_under_shardtop_run_trl_ends_as_it_does_alone() -> None:
    (alone,) = FINAL.findall(_alone_output())
    (probed,) = FINAL.findall((UNDER_RUN / "logs" / "command-vm.log").read_text())
    assert alone == probed == ("3", alone[1], "DEEPSPEED"), (alone, probed)


def test_the_report_reads_zero3_its_steps_and_the_model() -> None:
    data: dict[str, Any] = json.loads(report(UNDER_RUN, "json"))
    assert data["engine"] == "zero3" and data["step"] == 3 and data["oom"] is None
    (rank,) = data["ranks"]
    assert rank["status"] == "finished"
    # every parameter of the model, in bf16 (TRL's zero3.yaml), held by the one rank
    assert rank["param_bytes"] >= 2 * data["model"]["params"]


def test_the_rehearsal_of_the_first_and_last_of_eight_ranks() -> None:
    data: dict[str, Any] = json.loads(report(REHEARSED, "json"))
    assert data["rehearsal"]["world_size"] == 8 and data["rehearsal"]["ranks"] == [0, 7]
    assert data["engine"] == "zero3" and data["step"] == 3
    ranks = {entry["rank"]: entry for entry in data["ranks"]}
    assert {r: e["status"] for r, e in ranks.items()} == {0: "finished", 7: "finished"}
    assert ranks[0]["param_bytes"] == ranks[7]["param_bytes"]
    alone: dict[str, Any] = json.loads(report(UNDER_RUN, "json"))
    # an eighth of the partitioned parameters, and the persistent ones whole, on each rank
    assert ranks[0]["param_bytes"] < alone["ranks"][0]["param_bytes"] / 2
    assert data["model"]["params"] == alone["model"]["params"]
