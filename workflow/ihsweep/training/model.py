"""The study's decoder (docs/method.md#the-model-and-training-runs) in one file, in two families.

``gpt2`` (the default): pre-LayerNorm blocks, GELU MLP of 4x width, learned absolute positions,
biases in the attention's input projection. ``llama`` (docs/method.md#model-families): pre-RMSNorm
blocks, rotary position embeddings (RoPE, Hugging Face's ``rotate_half`` layout) on queries and
keys instead of learned positions, a SwiGLU MLP, no biases anywhere. Both: the MLP is optional
(attention-only models are a config switch), tied input/output embeddings, no dropout, and no
bias in the attention output, so that a head's output is exactly ``z_h @ W_O[h]``.

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

from ihsweep import cost

FAMILIES = ("gpt2", "llama")


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
    family: str = "gpt2"
    rope_base: float = 10000.0  # llama only

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}: one of {', '.join(FAMILIES)}")
        if self.family == "llama" and self.d_head % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: d_head {self.d_head} is odd")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_mlp(self) -> int:
        return cost.mlp_width(self.to_dict())

    def to_dict(self) -> dict:
        # A gpt2 model's dict is what it was before families existed: the run keys, checkpoints
        # and exports of every earlier study stay byte-identical.
        fields = asdict(self)
        if self.family == "gpt2":
            del fields["family"], fields["rope_base"]
        return fields


def rotary_cos_sin(cfg: GPTConfig, t: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """RoPE's cos and sin [t, d_head] for positions 0..t-1, as transformers' Llama computes them
    (float32 frequencies, each repeated for the two halves of the head)."""
    exponent = torch.arange(0, cfg.d_head, 2, dtype=torch.int64, device=device).float()
    inv_freq = 1.0 / (cfg.rope_base ** (exponent / cfg.d_head))
    freqs = torch.outer(torch.arange(t, device=device).float(), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [batch, head, pos, d_head]: each pair (i, i + d_head/2) turned by its angle."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.family == "gpt2")
        # No bias: a bias would be output shared by all heads and break the per-head decomposition.
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cache: dict | None = None,
        explicit: bool = False,
        rotary: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.n_head, self.d_head).transpose(1, 2) for y in (q, k, v))
        if rotary is not None:
            q, k = rotate(q, *rotary), rotate(k, *rotary)
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


class SwiGLU(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def norm(cfg: GPTConfig) -> nn.Module:
    """The family's normalisation: LayerNorm (gpt2) or RMSNorm (llama), both at eps 1e-5."""
    if cfg.family == "gpt2":
        return nn.LayerNorm(cfg.d_model)
    return nn.RMSNorm(cfg.d_model, eps=1e-5)


def mlp(cfg: GPTConfig) -> nn.Module:
    if cfg.family == "gpt2":
        return nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_mlp), nn.GELU(), nn.Linear(cfg.d_mlp, cfg.d_model)
        )
    return SwiGLU(cfg)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        if cfg.mlp:
            self.ln_2 = norm(cfg)
            self.mlp = mlp(cfg)
        else:
            self.mlp = None

    def forward(
        self,
        x: torch.Tensor,
        cache: dict | None = None,
        explicit: bool = False,
        rotary: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, explicit, rotary)
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Positions: learned (gpt2) or rotary (llama, in each attention; no parameters).
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.family == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = norm(cfg)
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's variance flat.
        residual = ("attn.out.weight", "mlp.2.weight", "mlp.down.weight")
        for name, p in self.named_parameters():
            if name.endswith(residual):
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
            n -= sum(e.weight.numel() for e in (self.wte, self.wpe) if e is not None)
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
        x = self.wte(idx)
        rotary = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device))
        else:
            rotary = rotary_cos_sin(self.cfg, t, idx.device)
        for block in self.blocks:
            x = block(x, act, explicit, rotary)
        return self.ln_f(x)
