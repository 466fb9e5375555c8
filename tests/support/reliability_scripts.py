"""Users' scripts that meet a fault, each run as its own process by ``test_reliability.py``.

``python -m tests.support.reliability_scripts MODE`` with ``SHARDTOP_RUNS_DIR`` set;
each prints ``trained N steps`` when its training reached the end.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch
from torch import nn

import shardtop.probe as st
from shardtop.runner.limits import data_segment_bytes

MiB = 1 << 20


class StrictModule(nn.Module):
    """A user's module that answers a read of an attribute it lacks with a KeyError, not an AttributeError.

    Training never reads such an attribute; the shard reader does (``getattr(target, "_trainer", None)``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise KeyError(f"{type(self).__name__} has no setting {name!r}") from None


class CalibratedWeight(nn.Parameter):
    """A parameter type that answers a question about its placement with an error until calibrated."""

    @property
    def placements(self) -> Any:
        raise RuntimeError("CalibratedWeight has no placement until it is calibrated")


class Blowup(nn.Module):
    """Asks for far more memory than any machine has (16 TiB): a real CPU OOM in its forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1 << 34, 1)


def train(model: nn.Module, steps: int, pause: float = 0.0) -> int:
    """A plain loop told to the probe; returns the steps done."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    done = 0
    for index in range(1, steps + 1):
        st.phase("forward", index)
        loss = nn.functional.mse_loss(model(x), y)
        st.phase("backward")
        loss.backward()
        st.phase("optimizer")
        optimizer.step()
        optimizer.zero_grad()
        st.step(index, loss=loss.item())
        done = index
        print(f"step {index}", flush=True)
        if pause:
            time.sleep(pause)
    return done


def plain() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def main(mode: str) -> None:
    if mode == "sigterm":  # the test sends SIGTERM while this trains
        model = plain()
        st.attach(model)
        train(model, 100_000, pause=0.05)
    elif mode == "oom-uncaught":  # attach() without watch(), and an OOM nobody catches
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), Blowup())
        st.attach(model)
        st.phase("forward", 1)
        model(torch.randn(8, 16))
    elif mode == "unreadable":  # and attach() without watch(): the ending is recorded at exit
        model = StrictModule()
        st.attach(model)
        print(f"trained {train(model, 5)} steps", flush=True)
    elif mode == "disk-fills":
        model = plain()
        with st.watch():
            st.attach(model)
            print(f"trained {train(model, int(sys.argv[2]))} steps", flush=True)
    elif mode == "no-thread":  # a cap too tight for a thread's stack (8 MiB), loose enough for this model
        model = plain()
        train(model, 1)  # what the loop imports lazily is imported before the cap
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (data_segment_bytes() + 6 * MiB, hard))
        with st.watch():
            st.attach(model)
            print(f"trained {train(model, 5)} steps", flush=True)
    elif mode in ("lightning-unreadable", "lightning-sigterm"):
        lightning(mode)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def lightning(mode: str) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from shardtop import ShardtopCallback

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = plain()
            if mode == "lightning-unreadable":
                self.net[0].weight = CalibratedWeight(self.net[0].weight.detach().clone())

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if mode == "lightning-sigterm":
                print(f"step {batch_idx + 1}", flush=True)
                time.sleep(0.05)
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    steps = 5 if mode == "lightning-unreadable" else 100_000
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[ShardtopCallback()],
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=8))
    print(f"trained {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
