"""Export one of our checkpoints as a Hugging Face GPT-2 model folder: ``find_checkpoint``
picks it, ``export_checkpoint`` writes it. The command line is ``ihsweep.steps.export``
(``python -m ihsweep.steps.export results/runs/<run id> OUT_DIR [--step N]``).

``OUT_DIR`` gets ``config.json`` and ``model.safetensors`` (``GPT2LMHeadModel.save_pretrained``),
which ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads with no code of ours,
giving our model's logits, and ``ihsweep_spec.json``: the checkpoint's metadata (run spec, step,
tokens, losses, the weights' sha256) and the path it was exported from.

Our model (``ihsweep.training.model``) is GPT-2's architecture with three differences, each
exported exactly: the attention output projection has no bias (exported as a zero bias); the MLP
is optional (an attention-only model gets an all-zero MLP: GELU(0) = 0, so the block adds
exactly 0 whatever GPT-2's ``ln_2`` gives it); our GELU is the exact (erf) one, GPT-2's
``activation_function="gelu"``, not its default tanh approximation ``gelu_new``. Our
``nn.Linear`` weights are [out, in]; GPT-2's ``Conv1D`` stores [in, out], so they are
transposed. The weights are read with ``load_checkpoint_weights``, which checks their sha256.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from ihsweep.files.layout import EXPORT_SPEC
from ihsweep.training.checkpoints import checkpoint_paths, list_checkpoints, read_checkpoint
from ihsweep.training.model import GPTConfig
from ihsweep.training.weights import load_checkpoint_weights


def find_checkpoint(path: str | Path, step: int | None = None) -> dict:
    """The metadata of one checkpoint: ``path`` is a run folder (its newest checkpoint, or the
    one of ``step``) or a checkpoint's .json or .safetensors file."""
    path = Path(path)
    if path.is_dir():
        if step is not None:
            meta_path = checkpoint_paths(path, step)[1]
            if not meta_path.exists():
                raise FileNotFoundError(f"no checkpoint of step {step}: {meta_path} is missing")
            return read_checkpoint(meta_path)
        metas = list_checkpoints(path, verify=False)  # the weights are verified when read
        if not metas:
            raise FileNotFoundError(f"no checkpoints under {path / 'ckpt'}")
        return metas[-1]
    if step is not None:
        raise ValueError("--step goes with a run folder, not with a checkpoint file")
    return read_checkpoint(path.with_suffix(".json"))


def gpt2_config(cfg: GPTConfig):
    """The ``GPT2Config`` of our model: same sizes, exact GELU, no dropout, LayerNorm eps 1e-5
    (torch's default, which ours use), tied embeddings, and no special tokens (ours have none)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_ctx,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=4 * cfg.d_model,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        scale_attn_weights=True,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )


def gpt2_state_dict(ours: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Our state dict under ``GPT2LMHeadModel``'s names and layouts."""
    d = cfg.d_model
    zeros, ones = torch.zeros, torch.ones
    out = {
        "transformer.wte.weight": ours["wte.weight"],
        "transformer.wpe.weight": ours["wpe.weight"],
        "transformer.ln_f.weight": ours["ln_f.weight"],
        "transformer.ln_f.bias": ours["ln_f.bias"],
        "lm_head.weight": ours["wte.weight"],  # tied
    }
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        # q, k, v in this order along the output, each split into heads alike: only transposed.
        out[dst + "attn.c_attn.weight"] = ours[src + "attn.qkv.weight"].T
        out[dst + "attn.c_attn.bias"] = ours[src + "attn.qkv.bias"]
        out[dst + "attn.c_proj.weight"] = ours[src + "attn.out.weight"].T
        out[dst + "attn.c_proj.bias"] = zeros(d)
        out[dst + "ln_1.weight"] = ours[src + "ln_1.weight"]
        out[dst + "ln_1.bias"] = ours[src + "ln_1.bias"]
        if cfg.mlp:
            out[dst + "ln_2.weight"] = ours[src + "ln_2.weight"]
            out[dst + "ln_2.bias"] = ours[src + "ln_2.bias"]
            out[dst + "mlp.c_fc.weight"] = ours[src + "mlp.0.weight"].T
            out[dst + "mlp.c_fc.bias"] = ours[src + "mlp.0.bias"]
            out[dst + "mlp.c_proj.weight"] = ours[src + "mlp.2.weight"].T
            out[dst + "mlp.c_proj.bias"] = ours[src + "mlp.2.bias"]
        else:  # attention-only: an MLP that adds exactly zero
            out[dst + "ln_2.weight"], out[dst + "ln_2.bias"] = ones(d), zeros(d)
            out[dst + "mlp.c_fc.weight"] = zeros(d, 4 * d)
            out[dst + "mlp.c_fc.bias"] = zeros(4 * d)
            out[dst + "mlp.c_proj.weight"] = zeros(4 * d, d)
            out[dst + "mlp.c_proj.bias"] = zeros(d)
    return {name: t.contiguous() for name, t in out.items()}


def export_checkpoint(meta: dict, out_dir: str | Path) -> Path:
    """Write the checkpoint ``meta`` (``list_checkpoints``/``read_checkpoint``'s dict) as a
    Hugging Face GPT-2 folder ``out_dir``; returns it. The folder is assembled beside
    ``out_dir`` and renamed into place, so ``out_dir`` is never half-written; an existing
    ``out_dir`` is replaced only if it is empty or an earlier export (has ihsweep_spec.json)."""
    from transformers import GPT2LMHeadModel

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / EXPORT_SPEC).exists():
        raise FileExistsError(f"{out_dir} exists and is not an export of ours; not replacing it")
    cfg = GPTConfig(**meta["model_config"])
    tensors = load_checkpoint_weights(meta)  # verified: DamagedFile if damaged
    model = GPT2LMHeadModel(gpt2_config(cfg))
    model.load_state_dict(gpt2_state_dict(tensors, cfg), strict=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        model.save_pretrained(tmp)  # transformers 5 always writes safetensors
        provenance = {k: v for k, v in meta.items() if k != "weights"}
        provenance["exported_from"] = str(Path(meta["weights"]).resolve())
        # The parameters our model has, not the GPT-2 folder's: no zero MLP of an
        # attention-only model (a suite of exports records this count).
        provenance["n_params"] = sum(t.numel() for t in tensors.values())
        (tmp / EXPORT_SPEC).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes 0700
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
