"""OOMs that sharding does not fix, told from what filled the memory: outputs kept with their autograd graphs,
and the logits of a large vocabulary with what the loss made of them.  Each beside a run that comes close
without it.

The scripts are users' own (``tests/own_scripts/``), under ``shardtop run``, each capping its own data segment
as a small GPU would cap it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardtop.units import format_bytes
from tests.support.own_job_runs import SCRIPTS, OwnRun, run_own

SHARDING_WORDS = ("shard the model", "micro-batch or sequence length, or activation checkpointing")
"""What the fix must not offer where the memory was not filled by parameters or activations."""


def _oom_finding(ran: OwnRun, runs: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    report = ran.report(runs)
    assert report["oom"] is not None, ran.describe()
    (finding,) = [f for f in report["findings"] if f["code"] == "oom"]
    return report["oom"], finding


def test_outputs_kept_with_their_graphs_are_told_and_evaluation_without_grad_is_the_fix(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ran = run_own(runs, "python", str(SCRIPTS / "eval_keeps_graphs.py"), "--cap-mib", "300")
    assert ran.code == 1, ran.describe()
    oom, finding = _oom_finding(ran, runs)
    kinds = oom["memory"]["by_kind"]
    assert kinds["kept"] > 0.7 * sum(v for v in kinds.values() if v), kinds  # earlier forwards' graphs and outputs
    assert oom["kept_graph_bytes"] == kinds["kept"]
    assert oom["kept_by"].startswith("`outputs` in evaluate (eval_keeps_graphs.py:")
    assert "torch.no_grad()" in finding["fix"] and "with their autograd graphs" in finding["fix"]
    assert not any(words in finding["fix"] for words in SHARDING_WORDS), finding["fix"]
    assert "copy of" not in finding["fix"]  # kept logits are not a loss's copy of them

    close = run_own(tmp_path / "close", "python", str(SCRIPTS / "eval_keeps_graphs.py"), "--cap-mib", "300",
                    "--no-grad")
    assert close.code == 0, close.describe()  # the same loop keeping the same logits, without their graphs


def test_the_logits_of_a_large_vocabulary_are_told_as_tokens_times_vocabulary(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ran = run_own(runs, "python", str(SCRIPTS / "large_vocab_loss.py"), "--cap-mib", "150")
    assert ran.code == 1, ran.describe()
    oom, finding = _oom_finding(ran, runs)
    assert oom["requested_bytes"] == 4 * 256 * 32768 * 4  # the fp32 copy of the bf16 logits
    (logits,) = [t for t in oom["stack_tensors"] if t["name"] == "logits"]
    assert (logits["shape"], logits["dtype"]) == ([4, 256, 32768], "bfloat16")
    assert "fp32 copy of `logits` (4 × 256 × 32,768 values" in finding["fix"]
    assert "1,024 tokens × 32,768" in finding["fix"] and "logits_to_keep" in finding["fix"]
    assert "sharding and activation checkpointing do not" in finding["fix"]
    # The bf16 logits the head returned, held by the script's variable: other's one part, the model's output.
    assert oom["memory"]["other_parts"] == {"output": logits["nbytes"]} == {"output": 4 * 256 * 32768 * 2}
    assert "64 MiB other (the model's output)" in finding["detail"]

    close = run_own(tmp_path / "close", "python", str(SCRIPTS / "large_vocab_loss.py"), "--cap-mib", "150",
                    "--vocab", "1024")
    assert close.code == 0, close.describe()  # the same loop, a small vocabulary


def test_what_the_loss_made_of_the_logits_is_a_share_of_its_own_beside_them(tmp_path: Path) -> None:
    """Under a cap that holds the logits and the loss's fp32 copy of them but not the log-softmax of that copy,
    the split at the OOM names both: the bf16 logits the model returned, and the fp32 copy the loss made of
    them (held on the failing stack as ``cross_entropy``'s ``input``), tokens × vocabulary × 4 bytes."""
    batch, seq, vocab = 4, 256, 32768
    args = ("--cap-mib", "300", "--batch", str(batch), "--seq", str(seq))
    runs = tmp_path / "runs"
    ran = run_own(runs, "python", str(SCRIPTS / "large_vocab_loss.py"), *args, "--vocab", str(vocab))
    assert ran.code == 1, ran.describe()
    oom, finding = _oom_finding(ran, runs)
    tokens = batch * seq
    assert oom["requested_bytes"] == tokens * vocab * 4  # the log-softmax of the fp32 copy
    split = oom["memory"]
    assert split["other_parts"] == {"loss": tokens * vocab * 4, "output": tokens * vocab * 2}
    assert split["by_kind"]["other"] == tokens * vocab * 6  # the logits and the loss's copy, nothing else
    copy, logits = format_bytes(tokens * vocab * 4), format_bytes(tokens * vocab * 2)
    said = f"{format_bytes(tokens * vocab * 6)} other ({copy} what the loss made of the model's output, {logits} the"
    assert said + " model's output)" in finding["detail"], finding["detail"]
    assert f"{tokens:,} tokens × {vocab:,}" in finding["fix"] and "logits_to_keep" in finding["fix"]
    assert not any(words in finding["fix"] for words in SHARDING_WORDS), finding["fix"]

    close = run_own(tmp_path / "close", "python", str(SCRIPTS / "large_vocab_loss.py"), *args, "--vocab", "1024")
    assert close.code == 0, close.describe()  # the same loop, a small vocabulary: no OOM, no logits story
    report = close.report(tmp_path / "close")
    assert report["oom"] is None and not [f for f in report["findings"] if "logits" in f.get("fix", "")]
