"""The models of the presets, shaped like the ones in the stories."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """One residual MLP block: what an auto-wrap policy would make a unit."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual: torch.Tensor = self.fc2(self.act(self.fc1(self.norm(x))))
        return x + residual


class MLP(nn.Module):
    def __init__(self, n_layers: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Linear(hidden, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(n_layers))
        self.head = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


class SequentialLinear(nn.Module):
    """Story 2's model: ``n_layers`` of ``nn.Linear(width, width)`` in one ``nn.Sequential``.

    ``layer_by_layer``: the layers are laid out on the meta device first, then allocated on the CPU and
    initialised one after another, still in ``__init__``.  The rank ends up holding the same whole model;
    where it cannot, the layer that no longer fits is the one that runs out, in a tree that already
    exists, as the layer being moved is on a GPU (where the CPU has no device to move the model to).
    """

    def __init__(self, n_layers: int, width: int, *, layer_by_layer: bool = False) -> None:
        super().__init__()
        if not layer_by_layer:
            self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(n_layers)))
            return
        with torch.device("meta"):
            self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(n_layers)))
        for layer in self.net:
            layer.to_empty(device="cpu")
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + MLP over patch tokens: the unit an auto-wrap policy wraps."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        attended: torch.Tensor = self.attn(h, h, h, need_weights=False)[0]
        x = x + attended
        mixed: torch.Tensor = self.mlp(self.norm2(x))
        return x + mixed


def transformer(depth: int, dim: int, heads: int) -> nn.Sequential:
    return nn.Sequential(*(TransformerBlock(dim, heads) for _ in range(depth)))


class PatchSegmenter(nn.Module):
    """Story 1's model, shaped like the question's: conv stem, four transformer stacks, conv head.

    conv1/bn1 -> transformers1 -> patches -> conv2/bn2 -> transformer_0 -> transformer_1
    -> transformers_out -> pixels -> conv_out -> out_layer.
    """

    def __init__(
        self, dim: int, depth: int, stem_depth: int, heads: int, patch: int, channels: int, classes: int
    ) -> None:
        super().__init__()
        self.patch = patch
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.transformers1 = transformer(stem_depth, dim, heads)
        self.conv2 = nn.Conv2d(channels, dim, patch, stride=patch)
        self.bn2 = nn.BatchNorm2d(dim)
        self.transformer_0 = transformer(depth, dim, heads)
        self.transformer_1 = transformer(depth, dim, heads)
        self.transformers_out = transformer(stem_depth, dim, heads)
        self.conv_out = nn.ConvTranspose2d(dim, channels, patch, stride=patch)
        self.out_layer = nn.Conv2d(channels, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        n, d, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        # Like the question: back to float32 after the stacks, which may run in fp16.
        tokens = self.transformers1(tokens).float()
        tokens = self.transformer_0(tokens)
        tokens = self.transformer_1(tokens)
        tokens = self.transformers_out(tokens).float()
        x = tokens.transpose(1, 2).reshape(n, d, h, w)
        logits: torch.Tensor = self.out_layer(self.relu(self.conv_out(x)))
        return logits
