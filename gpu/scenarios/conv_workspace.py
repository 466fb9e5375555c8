"""What a convolution's backward takes beyond its tensors on this GPU: the measurement the plan's
cuDNN workspace figures come from.

Two readings, printed as one JSON document (``--out FILE`` writes it there too):

1. ``preset``: the ``manual-placement`` preset's model as the preset places it (the first half on
   ``cuda:0``, the second on the CPU), trained for three steps with the allocator's history recording
   C++ stacks.  The trace of the third step is replayed to its peak; every block alive there is listed
   with its size and the frames that name the operation that asked for it (cuDNN, cuBLAS, at::native).
2. ``convs``: each convolution of that model on its own, at the input shape it sees in the preset:
   forward and backward with the gradients of input and weight, the allocator's peak during backward
   against what was allocated before it plus the gradients it made.  The difference is what the
   convolution's backward took for itself: its workspace.

    python gpu/scenarios/conv_workspace.py --out conv_workspace.json
    python gpu/scenarios/conv_workspace.py --batches 4 --no-preset     # the convolutions at batch 4 alone
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import torch
from torch import nn

from shardtop.runner.programs.fsdp_story import build_segmenter
from shardtop.runner.programs.manual_placement import SplitSegmenter

MiB = 1 << 20
PRESET_MODEL = {"dim": 768, "depth": 10, "stem_depth": 4, "heads": 12, "patch": 16, "channels": 32, "classes": 3}
IMAGE, BATCH = 256, 2
TELLING = re.compile(r"cudnn|cublas|cutlass|convolution|conv_|_conv|gemm|matmul|mm_out|addmm|softmax|"
                     r"attention|layer_norm|batch_norm|autograd::generated::\w+Backward", re.I)


def _frames(entry: dict[str, Any], limit: int = 6) -> list[str]:
    names = [f.get("name", "") for f in entry.get("frames", [])]
    telling = [n for n in names if TELLING.search(n)]
    return (telling or names)[:limit]


def _peak_of_trace(snapshot: dict[str, Any], device: int) -> dict[str, Any]:
    """Replay the device's trace: the moment the allocated bytes were highest, and the blocks alive then."""
    trace = snapshot["device_traces"][device]
    alive: dict[int, dict[str, Any]] = {}
    total = best = 0
    best_alive: dict[int, dict[str, Any]] = {}
    for e in trace:
        action = e.get("action")
        if action == "alloc":
            alive[e["addr"]] = e
            total += e["size"]
            if total > best:
                best, best_alive = total, dict(alive)
        elif action in ("free_requested", "free_completed") and e["addr"] in alive:
            total -= alive.pop(e["addr"])["size"]  # the first of the two: when the bytes stop counting
    blocks = sorted(best_alive.values(), key=lambda b: -b["size"])
    return {
        "traced_peak_bytes": best,
        "note": "bytes allocated within the traced step; blocks from before it are not in the trace",
        "blocks": [{"bytes": b["size"], "frames": _frames(b)} for b in blocks if b["size"] >= MiB],
    }


def preset_peak() -> dict[str, Any]:
    torch.manual_seed(0)
    model = SplitSegmenter(build_segmenter(PRESET_MODEL), torch.device("cuda:0"), torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.3)
    x = torch.randn(BATCH, 3, IMAGE, IMAGE)
    y = torch.randint(0, PRESET_MODEL["classes"], (BATCH, IMAGE, IMAGE))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all", max_entries=200_000)
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    found = _peak_of_trace(snapshot, 0)
    found.update(allocated_before_step=before, allocator_peak=torch.cuda.max_memory_allocated())
    return found


def _conv_inputs(batch: int) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    m = build_segmenter(PRESET_MODEL)
    c, d, p = PRESET_MODEL["channels"], PRESET_MODEL["dim"], PRESET_MODEL["patch"]
    side = IMAGE // p
    return [
        ("conv1", m.conv1, (batch, 3, IMAGE, IMAGE)),
        ("conv2", m.conv2, (batch, c, IMAGE, IMAGE)),
        ("conv_out", m.conv_out, (batch, d, side, side)),
        ("out_layer", m.out_layer, (batch, c, IMAGE, IMAGE)),
    ]


def conv_alone(name: str, conv: nn.Module, shape: tuple[int, ...]) -> dict[str, Any]:
    conv = conv.cuda()
    x = torch.randn(*shape, device="cuda", requires_grad=True)
    out = conv(x)
    grad = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    made = x.numel() * x.element_size() + sum(p.numel() * p.element_size() for p in conv.parameters())
    kernel = getattr(conv, "kernel_size", None)
    found = {
        "module": name,
        "type": type(conv).__name__,
        "input": list(shape),
        "output": list(out.shape),
        "kernel": list(kernel) if kernel else None,
        "stride": list(getattr(conv, "stride", ())),
        "backward_peak_over_before": peak - before,
        "gradients_made": made,
        "workspace": max(0, peak - before - made),
    }
    del x, out, grad
    conv.cpu()
    torch.cuda.empty_cache()
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    parser.add_argument("--batches", default=str(BATCH), help="the batch sizes to measure each convolution at: 2,4")
    parser.add_argument("--no-preset", action="store_true", help="measure the convolutions alone, not the preset")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if not torch.cuda.is_available():
        print("conv_workspace: needs a CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    result = {
        "gpu": props.name,
        "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "convs": [conv_alone(*c) for b in batches for c in _conv_inputs(b)],
        "preset": None if args.no_preset else preset_peak(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
