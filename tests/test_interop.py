"""Our checkpoints in other tools: the TransformerLens lines of docs/checkpoints.md, run as
written on a tiny exported model, give our PS and LA; and the parameter count an export and a
suite of exports record is the one our model has (an attention-only model's zero MLP left out),
which is the count the law's size term reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import REPO  # noqa: E402
from ihsweep.files.layout import EXPORT_SPEC  # noqa: E402
from ihsweep.probing.scores import (  # noqa: E402
    logit_attribution,
    make_probe_batches,
    prefix_matching_score,
    probe_model,
)
from ihsweep.steps import probe_suite  # noqa: E402
from ihsweep.training.checkpoints import list_checkpoints  # noqa: E402
from ihsweep.training.hf_export import export_checkpoint  # noqa: E402
from ihsweep.training.model import GPT, GPTConfig  # noqa: E402
from ihsweep.training.weights import save_checkpoint  # noqa: E402

PAGE = REPO / "docs" / "checkpoints.md"
PROBE = {"n_sequences": 8, "max_half_length": 50, "seed": 1234, "min_layer": 1}
B, C = 8, 32
# 2 layers of width 64, 4 heads, over 512 tokens and 64 positions, attention only: 70,400
# parameters; its GPT-2 export adds an all-zero MLP, ln_2 and attention output bias: 136,960.
SMALL = {"vocab_size": 512, "n_ctx": 64, "n_layer": 2, "n_head": 4, "d_model": 64}


def exported(root: Path, mlp: bool, step: int = 30) -> tuple[GPT, dict, Path]:
    """A model of ours with every weight but the LayerNorms drawn large (biases included, so a
    value bias moved out of ``z`` shows), saved as a checkpoint and exported as revision
    ``step<step>`` of a local suite."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, mlp=mlp)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.5)
    spec = {"batch_size": B, "context_size": C}
    meta = {"run_id": "toy/small/B8-C32-s0", "tokens": step * B * C, "train_loss": 1.0,
            "val_loss": 1.0, "model_config": model.cfg.to_dict(), "n_params": model.n_params(),
            "spec": spec}  # fmt: skip
    save_checkpoint(root / "run", step, model, meta)
    (meta,) = list_checkpoints(root / "run")
    folder = export_checkpoint(meta, root / "suite" / f"step{step}")
    return model, meta, folder


def transformer_lens_block() -> str:
    """The page's python block that uses TransformerLens, as a user copies it."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "from transformer_lens" in b]
    return block


def lens_scores(block: str, hf, tokens: torch.Tensor) -> pd.DataFrame:
    """PS and LA per head from what the block leaves: ``cache``, ``lens``."""
    namespace = {"model": hf, "tokens": tokens}
    exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the docs' own lines
    lens, cache = namespace["lens"], namespace["cache"]
    s = tokens.shape[1] // 2
    rows = []
    for layer in range(lens.cfg.n_layers):
        ps = prefix_matching_score(cache["pattern", layer], s)
        la = logit_attribution(cache["z", layer], lens.W_O[layer], lens.W_U.T, tokens, s)
        for head, (p, a) in enumerate(zip(ps.tolist(), la.tolist(), strict=True)):
            rows.append({"layer": layer, "head": head, "ps": p, "la": a})
    return pd.DataFrame(rows)


@torch.no_grad()
def test_the_docs_transformer_lens_lines_give_our_ps_and_la(tmp_path):
    pytest.importorskip(
        "transformer_lens.pretrained.weight_conversions",
        reason="TransformerLens 3.x is not installed (pip install 'transformer_lens>=3.9,<4')",
    )
    ours, _, folder = exported(tmp_path, mlp=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens, control = make_probe_batches(SMALL["vocab_size"], C, PROBE)
    want, _ = probe_model(ours, tokens, control=control, min_layer=PROBE["min_layer"])
    assert want["la"].std() > 1e-3 and want["ps"].std() > 1e-3  # a comparison with teeth

    block = transformer_lens_block()
    assert "fold_value_biases=False" in block
    got = lens_scores(block, hf, tokens)
    assert (got["la"] - want["la"]).abs().max() < 1e-6
    assert (got["ps"] - want["ps"]).abs().max() < 1e-6

    # TransformerLens's default folds the value bias out of z: LA moves, and this test sees it.
    folded = lens_scores(block.replace("fold_value_biases=False", "fold_value_biases=True"), hf,
                         tokens)  # fmt: skip
    assert (folded["la"] - want["la"]).abs().max() > 1e-4


def test_an_attention_only_export_records_the_parameters_it_has(tmp_path):
    ours, meta, folder = exported(tmp_path, mlp=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert ours.n_params() == meta["n_params"] == 70_400
    assert sum(p.numel() for p in hf.parameters()) == 136_960  # transformers counts the zeros
    assert json.loads((folder / EXPORT_SPEC).read_text())["n_params"] == 70_400

    # Probed as a suite, the tables (and so the emergence table and the law's size term, which
    # read n_params from them) carry the model's own count.
    suite = {"model": str(tmp_path / "suite"), "revisions": ["step30"], "batch_size": B,
             "context_size": C, "vocab_size": SMALL["vocab_size"]}  # fmt: skip
    out = tmp_path / "probes"
    argv = ["--name", "small", "--suite", json.dumps(suite), "--probe", json.dumps(PROBE),
            "--heads", str(out / "heads.parquet"), "--model-table", str(out / "model.parquet"),
            "--device", "cpu"]  # fmt: skip
    assert probe_suite.main(argv) == 0
    assert pd.read_parquet(out / "model.parquet")["n_params"].tolist() == [70_400]


def test_a_model_with_an_mlp_records_what_transformers_counts(tmp_path):
    ours, meta, folder = exported(tmp_path, mlp=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
    # GPT-2's attention output bias is the one parameter more (exported as zeros).
    extra = SMALL["n_layer"] * SMALL["d_model"]
    assert sum(p.numel() for p in hf.parameters()) == ours.n_params() + extra
    assert json.loads((folder / EXPORT_SPEC).read_text())["n_params"] == ours.n_params()
