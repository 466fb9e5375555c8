"""``shardtop plan -- CMD``: a user's own script planned through the injection, stopped before training.

The scripts are the users' own (``tests/own_scripts/`` import nothing of
shardtop), started by their own launchers on CPU processes, as a user types
them.  Each is asked for a million steps: a plan that let it train would
not come back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shardtop.inject import plan_env
from shardtop.plan.script import read_script_plan
from tests.support.cli import shardtop
from tests.support.distributed import free_port
from tests.support.own_job_runs import SCRIPTS, user_env

MANY_STEPS = "1000000"
PLAN_S = 240.0
"""A deadline, not a figure: a plan that let the script train its million steps would not come back."""


def env() -> dict[str, str]:
    """The user's shell: this Python's launchers (torchrun, deepspeed) first on PATH."""
    here = os.path.dirname(sys.executable)
    return user_env(PATH=os.pathsep.join([here, os.environ.get("PATH", "")]))


def plan(*words: str, fmt: str = "json") -> tuple[int, Any, str]:
    """``shardtop plan [WORDS before --] --format FMT -- COMMAND``; (exit code, the plan, the command's output)."""
    done = shardtop("plan", "--format", fmt, *words, runs_dir=Path("/nonexistent-runs"), timeout=PLAN_S, env=env())
    out = json.loads(done.stdout) if fmt == "json" and done.returncode == 0 else done.stdout
    return done.returncode, out, done.stderr


def test_a_raw_zero3_script_built_outside_zero_init() -> None:
    """Story 2 as a raw script: the plan says the model reaches each device whole before ZeRO-3 splits it;
    on six devices (story 2's) DeepSpeed's set-up then ends holding the partitions (its 512 x 512 weights are
    above ZeRO-3's persistence threshold), the fp32 master copy, the gradient partitions and the reduce bucket,
    which at DeepSpeed's default of 5e8 elements is far larger than this model."""
    code, doc, err = plan(
        "devices=6", "--", "deepspeed", "--num_gpus", "2", "--master_port", str(free_port()),
        str(SCRIPTS / "zero3_train.py"), "--steps", MANY_STEPS, "--width", "512",
    )
    assert code == 0, err[-3000:]
    assert "stopping before training" in err and "exits with return code = 1" not in err
    assert doc["preset"] is None and "zero3_train.py" in doc["command"]
    asked = doc["options"][0]
    assert asked["engine"] == "zero3" and asked["built_whole"] is True
    assert asked["strategy"] == "ZeRO-3, fp32, model built whole first"
    whole = doc["model"]["bytes"]
    assert doc["model"]["params"] == 4 * (512 * 512 + 512) + 513
    p = asked["per_rank"]
    assert p["buffers"] == 500_000_000 * 4 > whole
    assert p["phases"]["setup"] == p["params"] + p["grads"] + p["optimizer"] + p["buffers"]
    assert doc["devices"] == 6 and doc["accelerator"] == "cpu"
    assert any("built outside deepspeed.zero.Init" in line for line in doc["verdict"]["text"])
    assert asked["per_rank"]["activations"] > 0
    assert any("first dimension 2" in note for note in doc["notes"])
    assert asked["per_rank"]["optimizer"] > 0  # SGD without momentum: the fp32 master partition only


def test_an_fsdp2_script_under_torchrun() -> None:
    """Eager, and compiled after ``fully_shard``: the same plan, and the compiled one says the plan traced the
    eager forward, not what the compiled graph saves."""
    command = ("--", "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"),
               "--steps", MANY_STEPS)
    with ThreadPoolExecutor(2) as both:  # two plans at once: each waits on its imports
        eager, compiled = both.map(lambda extra: plan(*command, *extra), ((), ("--compile",)))
    code, doc, err = eager
    assert code == 0, err[-3000:]
    assert compiled[0] == 0, compiled[2][-3000:]
    said = [note for note in compiled[1]["notes"] if note.startswith("the model runs compiled (torch.compile)")]
    assert said and not any("compiled" in note for note in doc["notes"]), (compiled[1]["notes"], doc["notes"])
    assert compiled[1]["options"][0]["per_rank"]["params"] == doc["options"][0]["per_rank"]["params"]
    asked = doc["options"][0]
    assert asked["engine"] == "fsdp2" and doc["devices"] == 2
    params = 3 * (2 * 64 + 64 * 64 + 64) + 65
    assert doc["model"]["params"] == params
    assert abs(asked["per_rank"]["params"] - params * 4 / 2) <= 4 * 8  # half of it on each rank (FSDP2 pads)
    assert asked["per_rank"]["optimizer"] == 0  # plain SGD keeps no state
    assert asked["per_rank"]["activations"] > 0


def test_a_lightning_script_planned_at_its_training_step() -> None:
    code, text, err = plan("--", "python", str(SCRIPTS / "lightning_train.py"), fmt="text")
    assert code == 0, err[-3000:]
    assert "DDP, fp32  (as run)" in text
    assert "`net`, the first module the step called" in text.replace("\n  ", " ")
    assert "2 ranks on CPU processes" in text


def test_a_script_that_stops_after_handing_its_model_over_is_planned_from_what_it_handed() -> None:
    """FSDP1 would materialise a model built on the meta device; the plan's stand-in does not, and the script's
    own check stops it before its first forward (Fabric's does so for litgpt): planned without activations."""
    code, doc, err = plan("devices=8", "--", "torchrun", "--standalone", "--nproc_per_node", "2",
                          str(SCRIPTS / "fsdp1_from_meta.py"))
    assert code == 0, err[-3000:]
    assert "handing its model to FullyShardedDataParallel, before calling it" in err
    asked = doc["options"][0]
    assert asked["engine"] == "fsdp1" and doc["devices"] == 8
    params = 64 * 256 + 256 + 256 * 64 + 64 + 64 + 1
    assert doc["model"]["params"] == params
    assert abs(asked["per_rank"]["params"] - params * 4 / 8) <= 4 * 8  # an eighth of it on each rank
    assert asked["per_rank"]["activations"] == 0
    assert any("no forward pass was traced" in note for note in doc["notes"])


def test_a_model_built_on_the_meta_device_and_sharded_before_it_is_materialised() -> None:
    """torchtitan's way: no rank ever holds the whole model, so the set-up is not planned as built whole."""
    code, doc, err = plan("devices=8", "--", "torchrun", "--standalone", "--nproc_per_node", "2",
                          str(SCRIPTS / "fsdp2_from_meta.py"), "--steps", MANY_STEPS)
    assert code == 0, err[-3000:]
    asked = doc["options"][0]
    assert asked["engine"] == "fsdp2" and asked["built_whole"] is False
    assert "built whole" not in asked["strategy"]
    assert asked["per_rank"]["phases"]["setup"] < doc["model"]["bytes"]  # never the whole model on a rank


def test_a_plain_loop_that_calls_its_model_with_keywords_alone_is_traced_at_them() -> None:
    """No engine, and the model called as transformers' models are (``model(input_ids=..., labels=...)``): the
    first call is traced at its keyword arguments (a global forward hook is not given them)."""
    code, doc, err = plan("--", "python", str(SCRIPTS / "keyword_loop.py"), "--steps", MANY_STEPS)
    assert code == 0, err[-3000:]
    assert "could not trace" not in err and "stopping before training" in err
    asked = doc["options"][0]
    assert asked["engine"] == "single" and doc["model"]["batch_size"] == 4
    batch = 2 * 4 * 16 * 8  # input_ids and labels, 4 sequences of 16 int64 tokens
    assert asked["per_rank"]["activations"] > batch, asked["per_rank"]


def test_a_forward_the_plan_cannot_trace_is_planned_without_activations_saying_why() -> None:
    """A model that reads a value out of a tensor in its forward cannot run on the meta device: the plan is made
    of what the model holds, says why it has no activations, and fit takes those words, not a batch."""
    from shardtop.fit.predict import command_plan

    command = [sys.executable, str(SCRIPTS / "data_dependent_forward.py"), "--steps", MANY_STEPS]
    with ThreadPoolExecutor(2) as both:
        planned = both.submit(plan, "--", *command)
        for_fit = both.submit(command_plan, command, 1)
        code, doc, err = planned.result()
        traced = for_fit.result()
    assert code == 0, err[-3000:]
    why = "could not trace the first forward (RuntimeError: Tensor.item() cannot be called on meta tensors in "
    assert why in err
    assert any(note.startswith(f"no forward pass was traced: {why}") for note in doc["notes"]), doc["notes"]
    asked = doc["options"][0]
    assert doc["model"]["params"] == 32 * 64 + 64 + 64 * 32 + 32
    assert asked["per_rank"]["activations"] == 0
    assert traced.no_forward.startswith(why) and "data_dependent_forward.py:" in traced.no_forward


def test_a_command_that_never_reaches_an_engine_says_so() -> None:
    code, _, err = plan("--", "python", "-c", "print('no model here')", fmt="text")
    assert code == 2
    assert "before a rank handed a model to an engine" in err and "no model here" in err
    assert "Traceback" not in err


def test_a_command_that_fails_before_an_engine_says_its_error_under_its_launchers_summary() -> None:
    """A launcher prints its own summary after a rank's traceback (torchrun, accelerate): the error is said too."""
    script = ("import sys; print('Traceback (most recent call last):'); "
              "print('ValueError: device_id cuda:2 is out of range.'); "
              "[print(f'  launcher summary line {i}') for i in range(40)]; sys.exit(1)")
    code, _, err = plan("--", "python", "-c", script, fmt="text")
    assert code == 2
    said = err[err.index("nothing to plan"):]
    assert "launcher summary line 39" in said
    assert "The last error it printed:\n  ValueError: device_id cuda:2 is out of range." in said


def test_bad_plan_settings_are_refused_before_running_anything() -> None:
    code, _, err = plan("bogus=1", "--", "python", "-c", "raise SystemExit('ran')", fmt="text")
    assert code == 2 and "takes only devices=N and gpu=SIZE|CARD" in err and "ran" not in err
    code, _, err = plan("--", "no-such-program-here", fmt="text")
    assert code == 2 and "cannot run 'no-such-program-here'" in err
    done = shardtop("plan", "python", "train.py", runs_dir=Path("/nonexistent-runs"), env=env())
    assert done.returncode == 2 and "shardtop plan -- python train.py" in done.stderr


def test_what_a_script_hands_its_engine_is_planned_in_the_engines_terms() -> None:
    """The facts the rank takes at the hand-over, in the plan's words (pure: no script needed)."""
    from shardtop.plan.asked import Asked, strategy_of

    config = {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": 5e7,
                              "stage3_prefetch_bucket_size": "auto", "overlap_comm": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }
    s, notes = strategy_of(Asked(engine="zero3", deepspeed=config, partitioned=True, optimizer="SGD"))
    assert s.label == "ZeRO-3, bf16-mixed, optimizer offload"
    assert (s.zero.reduce_bucket_size, s.zero.prefetch_bucket_size, s.zero.overlap_comm) == (
        50_000_000, 50_000_000, True
    )
    # the config's optimizer, not the torch one
    assert s.optimizer.name == "AdamW" and not s.built_whole and notes == []

    s, notes = strategy_of(Asked(engine="fsdp1", units=(0, 3, 7), sharding="SHARD_GRAD_OP", half="fp16-mixed",
                                 offload_params=True, optimizer="SGD", momentum=0.9))
    assert s.label == "FSDP SHARD_GRAD_OP, fp16-mixed, CPU offload, half precision in units only"
    assert s.units == (3, 7) and s.root_wrapped and s.optimizer.state_bytes == 4 and notes == []

    s, notes = strategy_of(Asked(engine="fsdp2", units=(2, 5), trainer_precision="bf16-mixed", optimizer="Shampoo"))
    assert s.label == "FSDP2, bf16-mixed" and not s.root_wrapped and s.driver == "lightning"
    assert notes == ["Shampoo is not an optimizer the plan knows: planned with AdamW's state (8 bytes per parameter)"]

    s, notes = strategy_of(Asked(engine="single"))
    assert s.label == "one device, fp32" and "no optimizer existed by the first forward" in notes[0]


def test_the_roots_reshard_setting_is_not_taken_for_the_blocks() -> None:
    """accelerate and torchtitan keep the root whole after forward and reshard every block: FULL_SHARD.
    Only blocks that stay whole make the plan SHARD_GRAD_OP (the near miss)."""
    planned = {}
    for keep in ("root", "all"):
        code, doc, err = plan(
            "--", "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"),
            "--steps", MANY_STEPS, "--keep-whole", keep,
        )
        assert code == 0, err[-3000:]
        planned[keep] = doc["options"][0]
    assert planned["root"]["sharding"] == "FULL_SHARD"
    assert planned["root"]["strategy"].startswith("FSDP2, fp32")
    assert planned["all"]["sharding"] == "SHARD_GRAD_OP"
    assert planned["all"]["strategy"].startswith("FSDP2 (no reshard after forward)")
    kept, resharded = planned["all"]["per_rank"], planned["root"]["per_rank"]
    assert kept["gathered"] > resharded["gathered"]  # every unit whole at the end of forward
    assert kept["phases"]["forward"] > resharded["phases"]["forward"]


def test_a_unit_kept_whole_after_forward_is_planned_whole_from_forward_to_its_backward() -> None:
    """``fully_shard(head, reshard_after_forward=False)`` beside resharded blocks, as accelerate keeps the last
    norm and head: FULL_SHARD, with the head's unit kept whole."""
    with tempfile.TemporaryDirectory(prefix="shardtop-plan-") as seen_dir:
        command = ["torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"),
                   "--steps", MANY_STEPS, "--keep-whole", "head"]
        done = subprocess.run(command, env=plan_env(env(), Path(seen_dir)), capture_output=True, text=True,
                              timeout=PLAN_S, check=False)
        seen = read_script_plan(Path(seen_dir))
    assert seen is not None, done.stderr[-3000:]
    head = seen.description.row_of("head")
    assert head is not None
    assert seen.strategy.sharding == "FULL_SHARD" and seen.strategy.kept_whole == (head,)
    assert head in seen.strategy.units and seen.strategy.root_wrapped


def test_an_hf_trainer_under_deepspeed_is_planned_at_the_batch_it_passes() -> None:
    """The Trainer passes ``position_ids``, whose values transformers reads outside a trace: on meta tensors
    the plan traces it as torch.compile would, and sees the batch of 4 sequences of 16 tokens."""
    code, doc, err = plan(
        "--", "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "hf_trainer.py"),
        "--deepspeed", str(SCRIPTS / "ds_zero3.json"), "--steps", MANY_STEPS,
    )
    assert code == 0, err[-3000:]
    assert "planned at the first call of LlamaForCausalLM" in err
    asked = doc["options"][0]
    assert asked["engine"] == "zero3"
    assert any("first dimension 4" in note for note in doc["notes"]), doc["notes"]
    assert asked["per_rank"]["activations"] > 0


def test_lightning_bf16_true_is_planned_at_two_bytes_a_parameter() -> None:
    """``precision="bf16-true"`` keeps the model (and a torch optimizer's state) in bf16; "32-true" in fp32."""
    precisions = ("bf16-true", "32-true")
    with ThreadPoolExecutor(len(precisions)) as both:  # two plans at once: each waits on its imports
        done = dict(zip(precisions, both.map(
            lambda precision: plan("--", "python", str(SCRIPTS / "lightning_train.py"), precision), precisions
        ), strict=True))
    for code, _doc, err in done.values():
        assert code == 0, err[-3000:]
    planned = {precision: doc for precision, (_code, doc, _err) in done.items()}
    params = planned["bf16-true"]["model"]["params"]
    bf16, fp32 = (planned[p]["options"][0] for p in ("bf16-true", "32-true"))
    assert "bf16-true" in bf16["strategy"] and "bf16" not in fp32["strategy"]
    assert (bf16["per_rank"]["params"], fp32["per_rank"]["params"]) == (2 * params, 4 * params)
