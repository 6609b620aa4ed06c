"""A GPT-2-style decoder (docs/method.md#the-model-and-training-runs) in one file.

Pre-LayerNorm blocks, GELU MLP of 4x width (optional: attention-only models are a config switch),
learned absolute positions, tied input/output embeddings, no dropout and no biases in the
attention output so that a head's output is exactly ``z_h @ W_O[h]``.

Two attention paths share the same weights: training uses ``scaled_dot_product_attention``
(fused, never materialises the weights); ``forward(..., cache=True)`` computes attention
explicitly and returns, per layer, ``pattern`` [batch, head, query, key] and ``z``
[batch, pos, head, d_head] for the probes (names follow TransformerLens). ``explicit=True``
takes the explicit path without the cache: the compiled trainer's (``execution.compile``),
whose compiler fuses it better than it runs the fused kernel; the two agree within float
rounding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """A model of the study (``models.<name>`` in the schema, which holds the defaults) and the
    vocabulary size of its dataset."""

    vocab_size: int
    n_ctx: int
    n_layer: int
    n_head: int
    d_model: int
    mlp: bool

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        # No bias: a bias would be output shared by all heads and break the per-head decomposition.
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cache: dict | None = None, explicit: bool = False
    ) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.n_head, self.d_head).transpose(1, 2) for y in (q, k, v))
        if cache is None and not explicit:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            pattern = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            z = pattern @ v
            if cache is not None:
                cache["pattern"].append(pattern)
                cache["z"].append(z.transpose(1, 2))
        return self.out(z.transpose(1, 2).reshape(b, t, d))

    def W_O(self) -> torch.Tensor:
        """Per-head output projection, [head, d_head, d_model]: head h writes ``z_h @ W_O[h]``."""
        return self.out.weight.T.reshape(self.n_head, self.d_head, -1)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        if cfg.mlp:
            self.ln_2 = nn.LayerNorm(cfg.d_model)
            self.mlp = nn.Sequential(
                nn.Linear(cfg.d_model, 4 * cfg.d_model),
                nn.GELU(),
                nn.Linear(4 * cfg.d_model, cfg.d_model),
            )
        else:
            self.mlp = None

    def forward(
        self, x: torch.Tensor, cache: dict | None = None, explicit: bool = False
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, explicit)
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's variance flat.
        for name, p in self.named_parameters():
            if name.endswith("attn.out.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def W_U(self) -> torch.Tensor:
        """Unembedding, [vocab, d_model] (tied to the input embedding)."""
        return self.wte.weight

    def n_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, cache: bool = False, explicit: bool = False):
        """Logits [batch, pos, vocab]; with ``cache=True`` also the per-layer attention cache
        (``explicit``: the explicit attention path without the cache)."""
        act = {"pattern": [], "z": []} if cache else None
        logits = self.features(idx, act, explicit) @ self.W_U.T
        return (logits, act) if cache else logits

    def features(
        self, idx: torch.Tensor, act: dict | None = None, explicit: bool = False
    ) -> torch.Tensor:
        """The final LayerNorm's output [batch, pos, d_model]: the logits are ``features @ W_U.T``
        (a loss over a large vocabulary computes them a slice of positions at a time)."""
        t = idx.shape[1]
        if t > self.cfg.n_ctx:
            raise ValueError(f"sequence length {t} exceeds the model's n_ctx={self.cfg.n_ctx}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, act, explicit)
        return self.ln_f(x)
