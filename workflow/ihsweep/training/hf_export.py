"""Export one of our checkpoints as a Hugging Face model folder: ``find_checkpoint`` picks it,
``export_checkpoint`` writes it. The command line is ``ihsweep.steps.export``
(``python -m ihsweep.steps.export results/runs/<run id> OUT_DIR [--step N]``).

``OUT_DIR`` gets ``config.json`` and ``model.safetensors`` (``save_pretrained`` of a
``GPT2LMHeadModel`` for the gpt2 family, a ``LlamaForCausalLM`` for llama), which
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads with no code of ours,
giving our model's logits, and ``ihsweep_spec.json``: the checkpoint's metadata (run spec, step,
tokens, losses, the weights' sha256) and the path it was exported from.

A llama model is Llama's architecture as it is: RMSNorm, RoPE in the ``rotate_half`` layout, SwiGLU,
no biases; its fused q, k, v rows are cut into ``q_proj``, ``k_proj`` and ``v_proj``, its embeddings
are tied (``tie_word_embeddings``), and an attention-only model gets an all-zero ``down_proj``,
which adds exactly 0. A gpt2 model is GPT-2's architecture with three differences, each exported
exactly: the attention output projection has no bias (exported as a zero bias); the MLP is optional
(an attention-only model gets an all-zero MLP: GELU(0) = 0, so the block adds exactly 0 whatever
GPT-2's ``ln_2`` gives it); our GELU is the exact (erf) one, GPT-2's ``activation_function="gelu"``,
not its default tanh approximation ``gelu_new``. Our ``nn.Linear`` weights are [out, in]; GPT-2's
``Conv1D`` stores [in, out], so they are transposed. The weights are read with
``load_checkpoint_weights``, which checks their sha256.
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
        n_inner=cfg.d_mlp,
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


def llama_config(cfg: GPTConfig):
    """The ``LlamaConfig`` of a llama-family model: one key-value head per query head (no
    grouping), tied embeddings, RMSNorm eps 1e-5, no biases, no special tokens."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.n_ctx,
        rms_norm_eps=1e-5,
        rope_theta=cfg.rope_base,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def llama_state_dict(ours: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Our llama-family state dict under ``LlamaForCausalLM``'s names (both [out, in])."""
    d, f = cfg.d_model, cfg.d_mlp
    out = {
        "model.embed_tokens.weight": ours["wte.weight"],
        "model.norm.weight": ours["ln_f.weight"],
        "lm_head.weight": ours["wte.weight"],  # tied
    }
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = ours[src + "attn.qkv.weight"].split(d, dim=0)
        out |= {
            dst + "self_attn.q_proj.weight": q,
            dst + "self_attn.k_proj.weight": k,
            dst + "self_attn.v_proj.weight": v,
            dst + "self_attn.o_proj.weight": ours[src + "attn.out.weight"],
            dst + "input_layernorm.weight": ours[src + "ln_1.weight"],
        }
        if cfg.mlp:
            out |= {
                dst + "post_attention_layernorm.weight": ours[src + "ln_2.weight"],
                dst + "mlp.gate_proj.weight": ours[src + "mlp.gate.weight"],
                dst + "mlp.up_proj.weight": ours[src + "mlp.up.weight"],
                dst + "mlp.down_proj.weight": ours[src + "mlp.down.weight"],
            }
        else:  # attention-only: an MLP that adds exactly zero
            out |= {
                dst + "post_attention_layernorm.weight": torch.ones(d),
                dst + "mlp.gate_proj.weight": torch.zeros(f, d),
                dst + "mlp.up_proj.weight": torch.zeros(f, d),
                dst + "mlp.down_proj.weight": torch.zeros(d, f),
            }
    return {name: t.contiguous() for name, t in out.items()}


def hf_model(cfg: GPTConfig, ours: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The ``transformers`` model of our weights ``ours``: GPT-2's or Llama's, by family."""
    import transformers

    if cfg.family == "llama":
        model = transformers.LlamaForCausalLM(llama_config(cfg))
        tensors = llama_state_dict(ours, cfg)
    else:
        model = transformers.GPT2LMHeadModel(gpt2_config(cfg))
        tensors = gpt2_state_dict(ours, cfg)
    model.load_state_dict(tensors, strict=True)
    return model


def gpt2_state_dict(ours: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Our state dict under ``GPT2LMHeadModel``'s names and layouts."""
    d, f = cfg.d_model, cfg.d_mlp
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
            out[dst + "mlp.c_fc.weight"] = zeros(d, f)
            out[dst + "mlp.c_fc.bias"] = zeros(f)
            out[dst + "mlp.c_proj.weight"] = zeros(f, d)
            out[dst + "mlp.c_proj.bias"] = zeros(d)
    return {name: t.contiguous() for name, t in out.items()}


def export_checkpoint(meta: dict, out_dir: str | Path) -> Path:
    """Write the checkpoint ``meta`` (``list_checkpoints``/``read_checkpoint``'s dict) as a
    Hugging Face folder ``out_dir``; returns it. The folder is assembled beside
    ``out_dir`` and renamed into place, so ``out_dir`` is never half-written; an existing
    ``out_dir`` is replaced only if it is empty or an earlier export (has ihsweep_spec.json)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / EXPORT_SPEC).exists():
        raise FileExistsError(f"{out_dir} exists and is not an export of ours; not replacing it")
    cfg = GPTConfig(**meta["model_config"])
    tensors = load_checkpoint_weights(meta)  # verified: DamagedFile if damaged
    model = hf_model(cfg, tensors)
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
