"""A minimal LoRA: low-rank adapters on linear layers, switchable off, mergeable into the weights."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

LORA_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """``base(x) + scale * x A^T B^T`` with a frozen base layer; B starts at zero so the output is unchanged."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.rank = rank
        self.scale = alpha / rank
        self.enabled = True
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        for parameter in self.base.parameters():
            parameter.requires_grad_(False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        output = self.base(inputs)
        if not self.enabled:
            return output
        return output + (inputs @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged_linear(self) -> nn.Linear:
        """The base layer with ``scale * B A`` added to its weight."""
        merged = self.base
        with torch.no_grad():
            merged.weight += (self.lora_b @ self.lora_a) * self.scale
        for parameter in merged.parameters():
            parameter.requires_grad_(True)
        return merged


def _lora_children(model: nn.Module) -> Iterator[tuple[nn.Module, str, LoRALinear]]:
    """Every (parent, attribute name, LoRA layer) in ``model``."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                yield parent, child_name, child


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...] = LORA_TARGET_MODULES) -> int:
    """Freeze ``model`` and wrap every target linear layer in a LoRA adapter; return the trainable count."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(parent, child_name, LoRALinear(child, rank, alpha))
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its base weight and restore plain ``nn.Linear`` layers, in place."""
    for parent, child_name, child in list(_lora_children(model)):
        setattr(parent, child_name, child.merged_linear())


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run the base model (adapters off) inside the block; used for the KL reference."""
    layers = [layer for _, _, layer in _lora_children(model)]
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.enabled = True
