"""OOMs that sharding does not fix, recorded on an H100 (``tests/fixtures/runs/h100-oom-stories``,
``gpu/record.sh oom_stories``, torch 2.11): an evaluation loop that keeps every batch's outputs with their
autograd graphs, under a 20 GiB cap, and a loss over a 32 000-token vocabulary that finishes; recorded three
times (2026-12-06, 2026-12-07 01:46 and 07:29), the last by the probe that names the model's output and what the
loss made of it as they happen.

- the OOM is told from what filled the memory: tensors kept from earlier forwards, with what holds them,
  and the fix is ``torch.no_grad()``, never sharding or a smaller micro-batch;
- the split at the OOM accounts for every allocated byte;
- the allocator snapshots the run wrote open with the command the report prints (PyTorch's
  ``torch.cuda._memory_viz``), at the OOM and at a finished run's peak.
"""

from __future__ import annotations

import json
import pickle
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from shardtop.probe.allocator_timeline import live_blocks, timeline
from shardtop.probe.allocator_trace import traced_splits
from shardtop.read.memory_kinds import split_sentence
from shardtop.rundir.memory_figures import OtherParts
from shardtop.units import format_bytes
from tests.support.cli import report

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h100-oom-stories"
KEEPS_GRAPHS = RECORDINGS / "20261206-163541-eval-keeps-graphs-f3e2"
SMALL_VOCAB = RECORDINGS / "20261206-163614-small-vocab-87ea"
# Recorded again on 2026-12-07 (H100, torch 2.11) with the evaluation under no_grad and the 256k vocabulary
KEEPS_GRAPHS_AGAIN = RECORDINGS / "20261207-014625-eval-keeps-graphs-8a92"
NO_GRAD = RECORDINGS / "20261207-014639-eval-no-grad-6162"
LARGE_VOCAB = RECORDINGS / "20261207-014649-large-vocab-8afb"
SMALL_VOCAB_AGAIN = RECORDINGS / "20261207-014705-small-vocab-39c0"
CAP = 20 << 30
"""``--cap-gib 20``: each script's own ``set_per_process_memory_fraction``."""
SHARDING_WORDS = ("shard", "activation checkpointing on", "smaller micro-batch", "ZeRO")


def test_outputs_kept_with_their_graphs_are_told_with_what_holds_them_and_no_grad_as_the_fix() -> None:
    data: dict[str, Any] = json.loads(report(KEEPS_GRAPHS, "json"))
    oom = data["oom"]
    assert (oom["phase"], oom["module"]) == ("forward", "blocks.2")
    split = oom["memory"]
    held = {kind: n for kind, n in split["by_kind"].items() if n}
    assert held["kept"] > 0.75 * sum(held.values()), held
    assert oom["kept_graph_bytes"] == held["kept"]  # all of it through the graphs of earlier forwards
    assert split["unexplained"] == 0 and sum(held.values()) == split["allocated"] == oom["allocated"]
    assert oom["kept_by"].startswith("`outputs` in evaluate (eval_keeps_graphs.py:60), 10 tensors")
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    assert "torch.no_grad()" in finding["fix"] and "with their autograd graphs" in finding["fix"]
    assert "at the OOM (16.4 GiB)" in finding["fix"] and format_bytes(split["allocated"]) == "19.7 GiB"
    assert oom["kept_by"].endswith(", 4.88 GiB")
    assert "shard the model" not in finding["fix"] and "activation checkpointing on" not in finding["fix"]


def _snapshot_command(text: str, run: Path) -> list[str]:
    """The command the report prints to open a snapshot in a browser."""
    (line,) = [ln for ln in text.splitlines() if "torch.cuda._memory_viz" in ln]
    command = line.split("Open one in a browser: ", 1)[1].split(", or drag", 1)[0]
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "torch.cuda._memory_viz"] and str(run) in command
    return [sys.executable, *words[1:]]


def test_the_snapshots_open_with_the_command_the_report_prints(tmp_path: Path) -> None:
    for run, moment in ((KEEPS_GRAPHS, "oom"), (SMALL_VOCAB, "peak")):
        data = json.loads(report(run, "json"))
        (written,) = data["ranks"][0]["snapshots"]
        assert (written["moment"], written["file"], written["cut"]) == (moment, f"snapshots/rank-0-{moment}.pickle",
                                                                        False)
        snapshot = pickle.loads((run / written["file"]).read_bytes())
        assert len(snapshot["device_traces"][0]) == written["entries"] > 0
        command = _snapshot_command(report(run, "text"), run)
        out = tmp_path / f"{moment}.html"
        command[command.index("-o") + 1] = str(out)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        page = out.read_text()
        assert page.lstrip().startswith("<!DOCTYPE html>") and "Active Memory Timeline" in page and len(page) > 10_000
    at_oom = pickle.loads((KEEPS_GRAPHS / "snapshots" / "rank-0-oom.pickle").read_bytes())
    reserved = sum(segment["total_size"] for segment in at_oom["segments"])
    assert 20 << 30 >= reserved >= json.loads(report(KEEPS_GRAPHS, "json"))["oom"]["allocated"]  # under the cap


def test_the_same_evaluation_under_no_grad_finishes_far_under_the_cap() -> None:
    """The run that comes close: the loop keeps the same outputs, without their graphs."""
    kept: dict[str, Any] = json.loads(report(KEEPS_GRAPHS_AGAIN, "json"))
    assert kept["oom"]["phase"] == "forward" and kept["oom"]["kept_graph_bytes"] > 0.75 * kept["oom"]["allocated"]
    close: dict[str, Any] = json.loads(report(NO_GRAD, "json"))
    assert close["oom"] is None and close["ranks"][0]["status"] == "finished"
    allocator = close["ranks"][0]["allocator"]
    assert allocator["limit"] == CAP and allocator["peak"] < 0.4 * CAP
    assert (format_bytes(allocator["peak"]), format_bytes(kept["oom"]["allocated"])) == ("6.91 GiB", "19.7 GiB")
    assert not [f for f in close["findings"] if f["code"] == "oom"]


def test_the_logits_of_a_256k_vocabulary_on_a_gpu_are_told_as_tokens_times_vocabulary() -> None:
    data: dict[str, Any] = json.loads(report(LARGE_VOCAB, "json"))
    oom = data["oom"]
    tokens, vocab = 4 * 2048, 256_000
    assert oom["requested_bytes"] == tokens * vocab * 4  # the loss's fp32 copy of the logits
    split = oom["memory"]
    assert split["unexplained"] == 0
    assert sum(n for n in split["by_kind"].values() if n) == split["allocated"] == oom["allocated"]
    assert split["by_kind"]["other"] == tokens * vocab * 2  # the bf16 logits the model's head made
    assert (format_bytes(oom["requested_bytes"]), format_bytes(split["by_kind"]["other"])) == ("7.81 GiB", "3.91 GiB")
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    assert "fp32 copy of `input` (8,192 × 256,000 values" in finding["fix"]
    assert "8,192 tokens × 256,000" in finding["fix"] and "logits_to_keep" in finding["fix"]
    assert "sharding and activation checkpointing do not" in finding["fix"]
    assert not any(words in finding["fix"].replace("sharding and activation checkpointing do not", "")
                   for words in SHARDING_WORDS), finding["fix"]
    close: dict[str, Any] = json.loads(report(SMALL_VOCAB_AGAIN, "json"))
    assert close["oom"] is None and close["step"] == 3  # the same loop, a 32 000-token vocabulary


def test_other_at_the_small_vocabularys_peak_is_told_by_part_none_of_it_unnamed() -> None:
    """The peak of the 32 000-token loop is in the loss's backward: of its 2.44 GiB of other, 1.95 GiB are the
    gradients autograd made there (no Python frame: the log-softmax's and the logits' fp32 gradients) and
    500 MiB the bf16 logits the head made in the forward, which the script's variable still holds.  Recorded
    before the probe told the parts: they are read from the places the split kept."""
    data: dict[str, Any] = json.loads(report(SMALL_VOCAB_AGAIN, "json"))
    peak = data["ranks"][0]["memory_peak"]
    tokens, vocab = 4 * 2048, 32_000
    assert peak["other_parts"] == {"backward": 2 * tokens * vocab * 4, "forward": tokens * vocab * 2}
    assert sum(peak["other_parts"].values()) == peak["by_kind"]["other"]  # no share of other is left unnamed
    assert [(site["where"], site["part"]) for site in peak["other_at"]] == [
        (None, "backward"), ("large_vocab_loss.py:31 in forward", "forward")
    ]
    text = report(SMALL_VOCAB_AGAIN, "text")
    assert "other: 1.95 GiB made by autograd in the backward (gradients in flight" in text
    assert "; 500 MiB made in a forward and saved for no backward (a module's output still held" in text
    assert "at large_vocab_loss.py:31 in forward." in text


def test_the_large_vocabularys_oom_tells_the_logits_in_other_and_still_the_copy_as_the_fix() -> None:
    data: dict[str, Any] = json.loads(report(LARGE_VOCAB, "json"))
    split = data["oom"]["memory"]
    assert split["other_parts"] == {"forward": 4 * 2048 * 256_000 * 2}  # the bf16 logits, all of other
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    assert "3.91 GiB other (a forward's tensors saved for no backward)" in finding["detail"]
    assert "fp32 copy of `input`" in finding["fix"] and "gradients in flight" not in finding["fix"]


def test_the_small_vocabularys_trace_split_as_the_probe_splits_now_tells_the_logits_and_the_losss_backward() -> None:
    """The same H100 trace split again by today's probe, with the census it takes at the model's first
    backward hook seeing the tensor the model returned (the logits; the census was recorded before the
    probe looked for it): the peak is in the loss's backward, not the forward its last marker says, and
    other is the backward's fp32 gradients, the model's bf16 output and what the loss made of it: the fp32
    log-softmax ``cross_entropy`` allocated (and the loss itself, 4 bytes), which the recording's own split
    read as made by the script."""
    snapshot = pickle.loads((SMALL_VOCAB_AGAIN / "snapshots" / "rank-0-peak.pickle").read_bytes())
    tokens, vocab = 4 * 2048, 32_000
    line = timeline(snapshot["device_traces"][0], live_blocks(snapshot["segments"], 0))
    (logits,) = [b for b in line.alive_at(line.peak_position) if b.size == tokens * vocab * 2 and b.frames]
    labels = [("forward", 2), ("backward", 2), ("optimizer", 2), ("step", 2)]  # the last four markers'
    found = traced_splits(snapshot, 0, [{}, {logits.address: "output"}, {}, {}], labels)
    assert found is not None
    peak = found.peak
    assert (peak.phase, peak.step, peak.allocated) == ("backward", 2, line.peak)
    assert peak.other_parts == OtherParts(backward=2 * tokens * vocab * 4, output=tokens * vocab * 2,
                                          loss=tokens * vocab * 4 + 4)
    # a frame's path is shown from below the folders this process imports from: the checkout's, where the
    # recording was made from a checkout at the same path
    assert [(site.where.rsplit("/", 1)[-1], site.part) for site in peak.other_at] == [
        ("", "backward"), ("large_vocab_loss.py:67 in main", "loss"), ("large_vocab_loss.py:31 in forward", "output")
    ]
    assert peak.by_kind.script is not None and peak.by_kind.script < 1 << 20  # the tokens, 64 KiB
    said = split_sentence(peak)
    assert ("3.42 GiB other (1.95 GiB gradients in flight in the backward, 1000 MiB what the loss made of the "
            "model's output, 500 MiB the model's output)") in said
    recorded: dict[str, Any] = json.loads(report(SMALL_VOCAB_AGAIN, "json"))["ranks"][0]["memory_peak"]
    assert recorded["script_at"][0] == {"where": "large_vocab_loss.py:67 in main", "bytes": tokens * vocab * 4 + 4}
    assert "loss" not in recorded["other_parts"]  # the recording reads as it was made


def test_the_large_vocabularys_oom_trace_with_the_census_the_probe_takes_now_names_the_losss_copy() -> None:
    """The 256k-vocabulary OOM's H100 trace, split with the census the probe now takes at an OOM, which
    counts the tensors on the failing stack made of the model's output (``cross_entropy``'s ``input``, the
    fp32 copy ``logits.float()`` made) as the loss's and the logits as the model's output: the copy, which the
    recording read as made by the script, is other's part ``loss``; the labels the script made on the same
    line (``tokens[:, 1:].reshape(-1)``, 8,192 int64 values) stay the script's."""
    snapshot = pickle.loads((LARGE_VOCAB / "snapshots" / "rank-0-oom.pickle").read_bytes())
    tokens, vocab = 4 * 2048, 256_000
    line = timeline(snapshot["device_traces"][0], live_blocks(snapshot["segments"], 0))
    alive = line.alive_at(line.length - 1)
    (copy,) = [b for b in alive if b.size == tokens * vocab * 4]
    (logits,) = [b for b in alive if b.size == tokens * vocab * 2]
    found = traced_splits(snapshot, 0, [{}, {}], [("setup", 0), ("forward", 1)],
                          now={copy.address: "loss", logits.address: "output"})
    assert found is not None
    at_oom = found.at_end
    assert at_oom.parts() == OtherParts(output=tokens * vocab * 2, loss=tokens * vocab * 4)
    assert [(s.where.rsplit("/", 1)[-1], s.bytes) for s in at_oom.largest("script")] == [
        ("large_vocab_loss.py:67 in main", tokens * 8)
    ]
    recorded: dict[str, Any] = json.loads(report(LARGE_VOCAB, "json"))["oom"]["memory"]
    assert recorded["by_kind"]["script"] == tokens * vocab * 4 + tokens * 8  # as the recording reads


# Recorded again on 2026-12-07 at 07:29 (H100, torch 2.11, ``record-0729.log``) by the probe that names the
# model's output and what the loss made of it as they happen
KEEPS_GRAPHS_LIVE = RECORDINGS / "20261207-072914-eval-keeps-graphs-1468"
NO_GRAD_LIVE = RECORDINGS / "20261207-072926-eval-no-grad-493a"
LARGE_VOCAB_LIVE = RECORDINGS / "20261207-072933-large-vocab-25f7"
SMALL_VOCAB_LIVE = RECORDINGS / "20261207-072944-small-vocab-6044"


def test_recorded_live_the_large_vocabularys_oom_names_the_logits_and_the_losss_copy_to_the_byte() -> None:
    """8,192 tokens of a 256,000-token vocabulary: the bf16 logits the head returned and the fp32 copy
    ``cross_entropy`` made of them, each named where it is held, every allocated byte explained; the fix is
    the logits', never sharding or checkpointing."""
    data: dict[str, Any] = json.loads(report(LARGE_VOCAB_LIVE, "json"))
    oom = data["oom"]
    split = oom["memory"]
    tokens, vocab = 4 * 2048, 256_000
    assert split["other_parts"] == {"loss": tokens * vocab * 4, "output": tokens * vocab * 2}
    assert split["unexplained"] == 0 and sum(n for n in split["by_kind"].values() if n) == split["allocated"]
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    assert "chunked or fused linear-cross-entropy loss" in finding["fix"] and "logits_to_keep" in finding["fix"]
    assert "sharding and activation checkpointing do not" in finding["fix"]
    text = report(LARGE_VOCAB_LIVE, "text")
    assert "7.81 GiB what the loss made of the model's output, 3.91 GiB the model's output" in text


def test_recorded_live_the_small_vocabularys_peak_names_every_share_of_other() -> None:
    """The 32,000-token loop that finishes: at its peak, in the loss's backward, other is the backward's fp32
    gradients, the fp32 log-softmax the loss made (and the 4-byte loss) and the bf16 logits, none unnamed."""
    data: dict[str, Any] = json.loads(report(SMALL_VOCAB_LIVE, "json"))
    (rank,) = data["ranks"]
    peak = rank["memory_peak"]
    tokens, vocab = 4 * 2048, 32_000
    assert rank["status"] == "finished" and data["oom"] is None
    assert peak["other_parts"] == {"backward": 2 * tokens * vocab * 4, "loss": tokens * vocab * 4 + 4,
                                   "output": tokens * vocab * 2}
    assert sum(peak["other_parts"].values()) == peak["by_kind"]["other"] and peak["unexplained"] == 0
    assert not [f for f in data["findings"] if f["severity"] == "error"]


def test_recorded_live_the_evaluation_keeping_graphs_is_told_by_what_holds_them_its_no_grad_twin_not() -> None:
    kept: dict[str, Any] = json.loads(report(KEEPS_GRAPHS_LIVE, "json"))
    split = kept["oom"]["memory"]
    assert split["unexplained"] == 0 and split["by_kind"]["kept"] > 0.75 * split["allocated"]
    (finding,) = [f for f in kept["findings"] if f["code"] == "oom"]
    assert "torch.no_grad()" in finding["fix"] and "shard the model" not in finding["fix"]
    calm: dict[str, Any] = json.loads(report(NO_GRAD_LIVE, "json"))
    assert calm["oom"] is None and calm["ranks"][0]["status"] == "finished"
    assert calm["ranks"][0]["allocator"]["peak"] < CAP / 2 and not calm["findings"]
