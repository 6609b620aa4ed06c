"""The probes of docs/method.md (PS, LA and AR: #prefix-matching-score-ps,
#logit-attribution-la, #associative-recall-ar) on a Hugging Face causal LM (a checkpoint suite's
revisions).

``probe_model`` (``ihsweep.probing.scores``) scores any model that returns, from
``model(batch, cache=True)``, its logits and per layer ``pattern`` [batch, head, query, key] and
``z`` [batch, pos, head, d_head], and that has ``W_U`` [vocab, d_model] and
``blocks[layer].attn.W_O()`` [head, d_head, d_model]. ``HFProbeModel`` provides exactly that
from a ``transformers`` model's own modules, without copying or reimplementing it:

- ``pattern``: the model's ``attentions`` output (``output_attentions=True``), which exists only
  with the eager attention implementation (``load_revision`` loads with it).
- ``z``: the input of each layer's attention output projection (a forward pre-hook), which is
  the heads' outputs side by side, [batch, pos, head * d_head]. With grouped-query attention
  (Llama) it still holds one slice per query head.
- ``W_O``: each head's rows of that projection's weight (its bias is shared by all heads and,
  as in our models, not part of any head's output).
- ``W_U``: the output embedding, cut to the real vocabulary.

Suites pad their embeddings beyond the tokenizer's vocabulary (Pythia: 50,304 rows for 50,277
tokens). The probe batch is drawn from the real vocabulary, and AR ranks over it: logits and
``W_U`` are cut to ``vocab_size`` rows, so that untrained padding rows never outrank a token.

One adapter per architecture (``ARCHITECTURES``, chosen by ``config.model_type``) names where
the decoder layers and their output projections live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

from ihsweep.probing.scores import make_probe_batches, probe_model

__all__ = ["ARCHITECTURES", "Architecture", "HFProbeModel", "load_revision", "probe_hf"]


@dataclass(frozen=True)
class Architecture:
    """Where one architecture keeps its decoder layers and their attention output projections."""

    layers: Callable[[nn.Module], nn.ModuleList]  # the *ForCausalLM model -> its decoder layers
    out_proj: Callable[[nn.Module], nn.Module]  # a decoder layer -> its attention output proj.
    conv1d: bool  # the projection's weight is [in, out] (GPT-2's Conv1D), not nn.Linear's [out, in]


ARCHITECTURES = {
    "gpt2": Architecture(lambda m: m.transformer.h, lambda layer: layer.attn.c_proj, True),
    "gpt_neox": Architecture(
        lambda m: m.gpt_neox.layers, lambda layer: layer.attention.dense, False
    ),
    "llama": Architecture(lambda m: m.model.layers, lambda layer: layer.self_attn.o_proj, False),
    "olmo": Architecture(lambda m: m.model.layers, lambda layer: layer.self_attn.o_proj, False),
}


def architecture(model_type: str) -> Architecture:
    """The adapter of a ``config.model_type``; ValueError naming the supported ones otherwise."""
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"no probe adapter for model type {model_type!r}; supported model types: "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[model_type]


class _Heads:
    """``blocks[layer].attn`` of the probe interface: the layer's per-head output projection."""

    def __init__(self, proj: nn.Module, n_head: int, conv1d: bool):
        self.proj, self.n_head, self.conv1d = proj, n_head, conv1d

    def W_O(self) -> torch.Tensor:
        """Per-head output projection, [head, d_head, d_model]: head h writes ``z_h @ W_O[h]``."""
        w = self.proj.weight if self.conv1d else self.proj.weight.T  # [head * d_head, d_model]
        return w.reshape(self.n_head, -1, w.shape[1])


class _Block:
    def __init__(self, attn: _Heads):
        self.attn = attn


class HFProbeModel(nn.Module):
    """A ``transformers`` causal LM seen through the interface ``probe_model`` scores.

    ``vocab_size`` is the real vocabulary (the tokenizer's), at most the embedding's rows.
    The model must use eager attention (``attn_implementation="eager"``), the only one that
    returns attention weights.
    """

    def __init__(self, hf_model: nn.Module, vocab_size: int):
        super().__init__()
        config = hf_model.config
        arch = architecture(config.model_type)
        if config._attn_implementation != "eager":
            raise ValueError(
                f"the model uses {config._attn_implementation!r} attention, which returns no "
                'attention weights; load it with attn_implementation="eager" (load_revision does)'
            )
        self.hf = hf_model
        rows = hf_model.get_output_embeddings().weight.shape[0]
        if not 0 < vocab_size <= rows:
            raise ValueError(f"vocab_size {vocab_size} must be in 1..{rows} (the embedding's rows)")
        self.vocab_size = vocab_size
        self.n_head = config.num_attention_heads
        self._projections = [arch.out_proj(layer) for layer in arch.layers(hf_model)]
        self.blocks = [_Block(_Heads(p, self.n_head, arch.conv1d)) for p in self._projections]
        # The wrapper's mode is the model's: probe_model restores the mode it found.
        self.train(hf_model.training)

    @property
    def W_U(self) -> torch.Tensor:
        """Unembedding of the real vocabulary, [vocab, d_model]."""
        return self.hf.get_output_embeddings().weight[: self.vocab_size]

    def forward(self, idx: torch.Tensor, cache: bool = False):
        """Logits [batch, pos, vocab] over the real vocabulary; with ``cache=True`` also the
        per-layer ``pattern`` and ``z``."""
        if not cache:
            return self.hf(input_ids=idx, use_cache=False).logits[..., : self.vocab_size]
        z: list[torch.Tensor | None] = [None] * len(self._projections)

        def keeper(layer: int):
            def keep(module, args):
                z[layer] = args[0]  # [batch, pos, head * d_head]

            return keep

        handles = [p.register_forward_pre_hook(keeper(i)) for i, p in enumerate(self._projections)]
        try:
            out = self.hf(input_ids=idx, use_cache=False, output_attentions=True)
        finally:
            for handle in handles:
                handle.remove()
        if out.attentions is None or any(x is None for x in (*out.attentions, *z)):
            raise RuntimeError("the model returned no attention weights or skipped a layer")
        b, t = idx.shape
        act = {
            "pattern": list(out.attentions),
            "z": [x.reshape(b, t, self.n_head, -1) for x in z],
        }
        return out.logits[..., : self.vocab_size], act


def probe_hf(
    model: nn.Module, vocab_size: int, context_size: int, probe: dict
) -> tuple[pd.DataFrame, dict]:
    """``probe_model``'s heads table and summary for a ``transformers`` causal LM.

    Args:
        model: the ``transformers`` model (eager attention), or an ``HFProbeModel`` of it.
        vocab_size: the real vocabulary size (the tokenizer's, not the padded embedding's rows);
            the probe batch is drawn from it and AR ranks over it.
        context_size: the context size C that sets the probe half-length ``min(50, C // 2)``.
        probe: the probe settings (``n_sequences``, ``max_half_length``, ``seed``,
            ``min_layer``), as in a study's ``probe`` section.
    """
    if not isinstance(model, HFProbeModel):
        model = HFProbeModel(model, vocab_size)
    elif model.vocab_size != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} != the HFProbeModel's {model.vocab_size}")
    batch, control = make_probe_batches(vocab_size, context_size, probe)
    return probe_model(model, batch, control=control, min_layer=probe["min_layer"])


def load_revision(
    model_id_or_folder: str | Path,
    revision: str = "main",
    local_files_only: bool = False,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """One revision of a Hugging Face causal LM, in eval mode on ``device``, with the eager
    attention the probes need. ``model_id_or_folder`` is a hub id (``revision`` a branch, tag or
    commit, e.g. Pythia's ``step1000``) or a local folder (one folder per revision: pass its
    path and no revision)."""
    from transformers import AutoModelForCausalLM  # an optional dependency (the dev extra)

    model = AutoModelForCausalLM.from_pretrained(
        str(model_id_or_folder),
        revision=revision,
        local_files_only=local_files_only,
        dtype=dtype,
        attn_implementation="eager",
    )
    return model.to(device).eval()
