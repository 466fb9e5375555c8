"""A user's plain training loop whose own ``autograd.Function`` reads, in backward, an attribute set on
the parameter it saved (as TRL's chunked loss reads DeepSpeed's ``ds_status``), and whose forward takes
a ``torch.func`` gradient.  Nothing of shardtop in it.

``--saves parameter``: the Function saves the parameter itself and checks in backward that it got that
very object back, with its attribute, and the forward takes the gradient.  ``--saves copy``: the
Function saves a plain copy and reads nothing off it, and the forward takes no ``torch.func`` gradient
(the same loop, depending on neither).  Prints the loss of every step; exits 0.

    python tests/own_scripts/saved_parameter_attrs.py --saves parameter
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class MarkedLinear(torch.autograd.Function):
    """``x @ weight.t()``, whose backward needs the weight it saved to still be the marked parameter."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, saves_parameter: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.saves_parameter = saves_parameter
        ctx.save_for_backward(x, weight if saves_parameter else weight.detach().clone())
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        if ctx.saves_parameter and weight.status != "available":  # AttributeError if autograd handed back a copy
            raise RuntimeError(f"the saved weight is {weight.status}")
        return grad @ weight, grad.t() @ x, None


class Head(nn.Module):
    def __init__(self, dim: int, out: int, saves_parameter: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, dim) * 0.1)
        self.weight.status = "available"  # type: ignore[attr-defined]
        self.saves_parameter = saves_parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return MarkedLinear.apply(x, self.weight, self.saves_parameter)


class Net(nn.Module):
    def __init__(self, dim: int, saves_parameter: bool) -> None:
        super().__init__()
        self.body = nn.Linear(dim, dim)
        self.head = Head(dim, 4, saves_parameter)
        self.uses_func = saves_parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.body(x))
        # a penalty's gradient by torch.func, which refuses to run under saved-tensor hooks
        slope = torch.func.grad(lambda t: (t**2).sum())(hidden.detach()) if self.uses_func else 2 * hidden.detach()
        return self.head(hidden) + 1e-3 * slope.mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--saves", choices=("parameter", "copy"), default="parameter")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net(16, args.saves == "parameter")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 16)
    for step in range(1, args.steps + 1):
        loss = model(data).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
