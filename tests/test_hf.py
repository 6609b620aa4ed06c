"""Probing Hugging Face causal LMs (ihsweep.probing.hf) against an independent computation.

For each supported architecture a tiny random model (2 layers, 4 heads, width 32, large weights
so that scores differ from head to head) is saved as three local "revision" folders, each with
perturbed weights, loaded with ``load_revision`` and probed. The reference recomputes every
score without the wrapper or its hooks: PS from the model's own ``output_attentions``, LA from
``z`` rebuilt by hand as the attention weights times the value projection of the layer's
normalised input (``output_hidden_states``) and from each head's slice of the output
projection's weight, AR from the logits, all read literally (test_probes' helpers) in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ihsweep.probing.hf import HFProbeModel, load_revision, probe_hf  # noqa: E402
from ihsweep.probing.scores import make_probe_batch, make_probe_batches  # noqa: E402
from test_probes import reference_ar, reference_head  # noqa: E402

V = 100  # the tokenizer's vocabulary; GPT-NeoX's embedding is padded to 128 rows beyond it
C = 40  # context size: probe half-length s = 20
PROBE = {"n_sequences": 6, "max_half_length": 50, "seed": 1234, "min_layer": 1}
REVISIONS = ["step0", "step1", "step2"]


def tiny(model_type: str) -> torch.nn.Module:
    common = {"max_position_embeddings": C, "num_hidden_layers": 2, "num_attention_heads": 4}
    if model_type == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=V, n_positions=C, n_embd=32, n_layer=2, n_head=4, bos_token_id=None,
            eos_token_id=None,
        )  # fmt: skip
    elif model_type == "gpt_neox":
        config = transformers.GPTNeoXConfig(
            vocab_size=128, hidden_size=32, intermediate_size=128, eos_token_id=None, **common
        )
    elif model_type == "llama":  # grouped-query attention: 2 key/value heads for 4 query heads
        config = transformers.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_key_value_heads=2, **common
        )
    elif model_type == "olmo":
        config = transformers.OlmoConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, pad_token_id=None, **common
        )
    model_class = transformers.AutoModelForCausalLM
    return model_class.from_config(config, attn_implementation="eager").eval()


def save_revisions(model: torch.nn.Module, root: Path) -> list[Path]:
    """One folder per revision, each with the weights redrawn large (norms left alone)."""
    folders = []
    for i, revision in enumerate(REVISIONS):
        torch.manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "ln" not in name and "norm" not in name:
                    p.normal_(0.0, 0.4)
        folder = root / revision
        model.save_pretrained(folder)
        folders.append(folder)
    return folders


def layers_and_values(model) -> tuple[list, list]:
    """Per layer: its input normalisation and a function of the normalised input giving the
    values per query head [batch, pos, head, d_head], written from each architecture's
    modeling file; and each head's output projection [head, d_head, d_model] from the weight."""
    kind, cfg = model.config.model_type, model.config
    n, d = cfg.num_attention_heads, cfg.hidden_size
    dh = d // n
    if kind == "gpt2":
        layers = model.transformer.h
        norms = [layer.ln_1 for layer in layers]
        values = [lambda x, a=layer.attn: a.c_attn(x)[..., 2 * d :].unflatten(-1, (n, dh))
                  for layer in layers]  # fmt: skip
        w_o = [layer.attn.c_proj.weight for layer in layers]  # Conv1D: [in, out]
    elif kind == "gpt_neox":  # fused qkv laid out [head, (q, k, v), d_head]
        layers = model.gpt_neox.layers
        norms = [layer.input_layernorm for layer in layers]
        values = [lambda x, a=layer.attention: a.query_key_value(x).unflatten(-1, (n, 3 * dh))[
                  ..., 2 * dh :] for layer in layers]  # fmt: skip
        w_o = [layer.attention.dense.weight.T for layer in layers]
    else:  # llama, olmo: key/value head g serves query heads g * n_rep .. (g + 1) * n_rep - 1
        layers = model.model.layers
        norms = [layer.input_layernorm for layer in layers]
        rep = n // cfg.num_key_value_heads
        values = [lambda x, a=layer.self_attn: a.v_proj(x).unflatten(-1, (-1, dh))
                  .repeat_interleave(rep, dim=2) for layer in layers]  # fmt: skip
        w_o = [layer.self_attn.o_proj.weight.T for layer in layers]
    heads_o = [torch.stack([w[h * dh : (h + 1) * dh] for h in range(n)]) for w in w_o]
    return list(zip(norms, values, strict=True)), heads_o


@torch.no_grad()
def reference_scores(model, tokens: torch.Tensor) -> tuple[np.ndarray, np.ndarray, tuple]:
    """PS and LA per head (layer-major) and AR, from the plain model's outputs, in float64."""
    out = model(input_ids=tokens, output_attentions=True, output_hidden_states=True)
    W_U = model.get_output_embeddings().weight[:V].double()
    ps_rows, la_rows = [], []
    norm_value, heads_o = layers_and_values(model)
    for layer, ((norm, value), W_O) in enumerate(zip(norm_value, heads_o, strict=True)):
        pattern = out.attentions[layer].double()  # [batch, head, q, k]
        v = value(norm(out.hidden_states[layer])).double()  # [batch, k, head, d_head]
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        for h in range(W_O.shape[0]):
            ps, la = reference_head(pattern, z, W_O[h].double(), W_U, tokens, h)
            ps_rows.append(ps)
            la_rows.append(la)
    ar = reference_ar(out.logits[..., :V].double(), tokens)
    return np.array(ps_rows), np.array(la_rows), ar


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "llama", "olmo"])
def test_probes_of_every_revision_match_the_independent_computation(model_type, tmp_path):
    folders = save_revisions(tiny(model_type), tmp_path)
    tokens, control = make_probe_batches(V, C, PROBE)
    seen_ps = []
    for folder in folders:
        model = load_revision(folder, local_files_only=True)
        heads, summary = probe_hf(model, V, C, PROBE)
        ps, la, (acc, rank) = reference_scores(model, tokens)
        control_ps, _, _ = reference_scores(model, control)  # PS reads positions only

        assert model.config.model_type == model_type and not model.training
        assert list(zip(heads["layer"], heads["head"], strict=True)) == [
            (i, h) for i in (0, 1) for h in range(4)
        ]
        assert ps.std() > 1e-3 and la.std() > 1e-3 and rank > 0  # a non-degenerate comparison
        np.testing.assert_allclose(heads["ps"], ps, rtol=0, atol=1e-5)
        np.testing.assert_allclose(heads["la"], la, rtol=0, atol=1e-5)
        np.testing.assert_allclose(heads["ps_content"], ps - control_ps, rtol=0, atol=1e-5)
        assert summary["ar_acc"] == pytest.approx(acc, abs=1e-12)
        assert summary["ar_rank"] == pytest.approx(rank, abs=1e-12)
        seen_ps.append(ps)
    assert not np.allclose(seen_ps[0], seen_ps[1])  # the revisions are different models


@torch.no_grad()
def test_padded_embedding_rows_are_not_the_vocabulary(tmp_path):
    # GPT-NeoX's 128 embedding rows, 100 of them the tokenizer's: make the padding outrank
    # every real token; the probe batch and AR see the 100 real ones only.
    model = tiny("gpt_neox")
    model.get_output_embeddings().weight[V:] *= 50
    wrapped = HFProbeModel(model, V)
    tokens = make_probe_batch(V, C, PROBE["n_sequences"], PROBE["max_half_length"], PROBE["seed"])
    assert int(tokens.max()) < V
    logits, cache = wrapped(tokens, cache=True)
    assert logits.shape[-1] == wrapped.W_U.shape[0] == V
    _, summary = probe_hf(wrapped, V, C, PROBE)
    padded = reference_ar(model(input_ids=tokens).logits.double(), tokens)
    assert summary["ar_rank"] == pytest.approx(reference_ar(logits.double(), tokens)[1])
    assert padded[1] > summary["ar_rank"] + 10  # ranked over 128 rows, the padding would count
    with pytest.raises(ValueError, match="vocab_size 129 must be in 1..128"):
        HFProbeModel(model, 129)


def test_a_bf16_model_is_probed_like_its_float32_weights(tmp_path):
    (folder, *_) = save_revisions(tiny("llama"), tmp_path)
    heads32, summary32 = probe_hf(load_revision(folder, local_files_only=True), V, C, PROBE)
    model = load_revision(folder, local_files_only=True, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    heads16, summary16 = probe_hf(model, V, C, PROBE)
    np.testing.assert_allclose(heads16["ps"], heads32["ps"], atol=0.02)
    np.testing.assert_allclose(heads16["la"], heads32["la"], atol=0.05)


def test_an_architecture_without_adapter_or_without_eager_attention_is_refused():
    config = transformers.OPTConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
        max_position_embeddings=C, word_embed_proj_dim=32,
    )  # fmt: skip
    opt = transformers.OPTForCausalLM(config)
    with pytest.raises(ValueError, match=r"'opt'; supported model types: gpt2, gpt_neox, llama"):
        probe_hf(opt, V, C, PROBE)
    sdpa = transformers.AutoModelForCausalLM.from_config(
        tiny("gpt2").config, attn_implementation="sdpa"
    )
    with pytest.raises(ValueError, match='attn_implementation="eager"'):
        HFProbeModel(sdpa, V)
