"""What a training loop that keeps nothing still holds from its first steps, block by block.

shardtop's split counts a block made in an earlier step and alive now, which no census names, as
"kept from earlier steps". Runs that keep nothing show 1 to 3.5 MiB of it on an H200. This loop
records the allocator's history from before its first step, and at the end prints every block made
during the loop that is still alive, with its size and the frames that made it (Python and C++),
grouped. Optimizer state (made in the first step, alive to the end) is printed as such.

    python3 gpu/scenarios/what_is_kept.py [--amp] [--conv] [--steps 4]
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch import nn

MiB = 1 << 20


def model_of(conv: bool) -> tuple[nn.Module, torch.Tensor]:
    if conv:
        model = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                              nn.Conv2d(64, 32, 3, padding=1))
        return model.cuda(), torch.randn(8, 32, 128, 128, device="cuda")
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
    return model.cuda(), torch.randn(64, 1024, device="cuda")


def frames_of(block: dict) -> list[str]:
    out = []
    for f in block.get("frames") or []:
        name, where = f.get("name", "?"), f"{f.get('filename', '?').rsplit('/', 1)[-1]}:{f.get('line', 0)}"
        if any(s in name for s in ("c10::", "std::", "_PyEval", "PyObject", "_start", "__libc")):
            continue
        out.append(f"{where} {name[:90]}")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--amp", action="store_true", help="fp16 autocast and a GradScaler")
    p.add_argument("--conv", action="store_true", help="convolutions (cuDNN) instead of linears (cuBLAS)")
    a = p.parse_args()
    model, x = model_of(a.conv)
    opt = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda", enabled=a.amp)
    state_sizes = collections.Counter(p.numel() * 4 for p in model.parameters())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500_000, context="all", stacks="all")
    for _ in range(a.steps):
        with torch.autocast("cuda", dtype=torch.float16, enabled=a.amp):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    groups: dict[tuple[int, tuple[str, ...]], int] = collections.Counter()
    state = 0
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated" or not block.get("frames"):
                continue  # free, or made before the recording began (the model, the input)
            size = block["size"]
            frames = tuple(frames_of(block))
            if state_sizes.get(size) and any("adam" in f.lower() or "optim" in f.lower() for f in frames):
                state += size
                continue
            groups[(size, frames[:14])] += 1
    print(f"amp={a.amp} conv={a.conv} steps={a.steps} torch {torch.__version__}")
    print(f"allocated before the loop {before / MiB:.2f} MiB, after {torch.cuda.memory_allocated() / MiB:.2f} MiB")
    print(f"optimizer state made in the loop: {state / MiB:.2f} MiB")
    from shardtop.probe.allocator import library_workspaces

    print(f"the workspaces' block sizes shardtop knows: {sorted(library_workspaces())}")
    for (size, frames), n in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1]):
        print(f"--- {n} × {size} B ({size / MiB:.3f} MiB)")
        for f in frames:
            print(f"      {f}")


if __name__ == "__main__":
    main()
