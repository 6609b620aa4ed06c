"""Model families (``models.<name>.family``): gpt2, every study's default, and llama (RoPE,
RMSNorm, SwiGLU, no biases).

- Today's run keys are pinned: a family that is not set changes no key, checkpoint or result.
- A hand-built llama model whose layer-1 head is an exact induction head (a layer-0
  previous-token head found by rotary position alone, a layer-1 head matching by content on
  rotary pairs too slow to turn within the sequence) scores PS, LA and AR of 1 on its layer-1
  head; the same model exported to ``LlamaForCausalLM`` and probed by the suite path
  (``ihsweep.probing.hf``) gives the same per-head scores.
- The cost model counts the family's parameters and matmul FLOPs as the model has them.

Exports of trained llama runs, and their probe tables, are in test_export.py; a llama study
through Snakemake in test_workflow.py.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from ihsweep import cost
from ihsweep.analysis.families import compare_families, families_table
from ihsweep.config import study_of_files
from ihsweep.config.keys import StudyPaths
from ihsweep.probing.metrics import HEAD_SCORES
from ihsweep.probing.scores import make_probe_batches, probe_model
from ihsweep.training.model import GPT, GPTConfig
from torch.utils.flop_counter import FlopCounterMode

# The run folders of config.yaml as they were before model families existed (commit 0223477).
TODAYS_RUN_DIRS = [
    "results/runs/kjv-copy/w64/B16-C8-s0-e2eace97",
    "results/runs/kjv-copy/w64/B16-C16-s0-481242d4",
    "results/runs/kjv-copy/w64/B16-C32-s0-2b49e87f",
    "results/runs/kjv-copy/w64/B64-C8-s0-f8a4a61c",
    "results/runs/kjv-copy/w64/B64-C16-s0-07ee026d",
    "results/runs/kjv-copy/w64/B64-C32-s0-4c35b6bf",
    "results/runs/semi-f0.5-r0.7/w64/B8-C32-s0-4ebdb2e6",
    "results/runs/semi-f0.5-r1/w64/B8-C32-s0-86017049",
    "results/runs/semi-f0.9-r0.7/w64/B8-C32-s0-f683a4d9",
    "results/runs/semi-f0.9-r1/w64/B8-C32-s0-f1043d79",
    "results/runs/zipf+D+C-f0.9-r0.9/w64/B8-C32-s0-62c13c75",
    "results/runs/zipf+D-C-f0.9-r0.9/w64/B8-C32-s0-7cd0d3d7",
    "results/runs/zipf-D-f0.9-r0.9/w64/B8-C32-s0-9859fda2",
    "results/runs/unif+D+C-f0.9-r0.9/w64/B8-C32-s0-e6b0ab92",
    "results/runs/unif+D-C-f0.9-r0.9/w64/B8-C32-s0-d04ce3c7",
    "results/runs/unif-D-f0.9-r0.9/w64/B8-C32-s0-bf184410",
]


def test_a_study_without_families_keeps_todays_run_keys():
    study = study_of_files([REPO / "config.yaml"])
    paths = StudyPaths(study)
    assert [str(paths.run_dir(run)) for run in study.runs] == TODAYS_RUN_DIRS
    assert all("family" not in study.model_of(run) for run in study.runs)


# --- a hand-built rotary induction head ---------------------------------------------------------

V = 32  # tokens, one-hot in residual dims 0..31
CONST = V  # a residual dim that is 1 for every token
PREV = V + 1  # residual dims PREV..PREV+31: the previous token, written by layer 0
D = 128  # one head per layer, d_head = 128: rotary pairs (i, i + 64), i < 64
ROPE_BASE = 1e8  # pair i turns base^(-i/64) radians a position: pair 0 one, pairs >= 32 <= 1e-4
POSITION_PAIRS = range(5)  # frequencies 1, 0.56, 0.32, 0.18, 0.1: together peaked at one offset
CONTENT = 32  # pairs 32..63 match by content: they turn at most 2e-3 radians over 20 positions


def rotary_induction_model() -> GPT:
    """Layer 0: a previous-token head that attends from p to p - 1 by RoPE alone (constant query
    and key whose angles differ by one position's turn) and copies that token into the PREV
    dims. Layer 1: an induction head whose query is the current token and whose key is the
    previous token (less the key's own token), on the slow pairs, and which writes 3 x the
    attended token to the logits."""
    cfg = GPTConfig(vocab_size=V, n_ctx=64, n_layer=2, n_head=1, d_model=D, mlp=False,
                    family="llama", rope_base=ROPE_BASE)  # fmt: skip
    model = GPT(cfg).eval()
    half = D // 2
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.ln_f, *(b.ln_1 for b in model.blocks)):
            norm.weight.fill_(1.0)
        model.wte.weight[:, :V] = torch.eye(V)
        model.wte.weight[:, CONST] = 1.0
        # RMSNorm scales every position alike: its residual holds one-hots and the constant.
        # The queries are scaled by sqrt(d_head) against attention's 1 / sqrt(d_head).
        scale_0, scale_1, sharp = math.sqrt(D / 2), math.sqrt(D / 3), math.sqrt(D)
        q0, k0, v0 = model.blocks[0].attn.qkv.weight.split(D)
        for i in POSITION_PAIRS:
            omega = ROPE_BASE ** (-i / half)
            q0[i, CONST] = 40 * sharp * math.cos(omega)
            q0[i + half, CONST] = -40 * sharp * math.sin(omega)
            k0[i, CONST] = 1.0
        q0 /= scale_0
        k0 /= scale_0
        v0[:V, :V] = torch.eye(V) / scale_0
        model.blocks[0].attn.out.weight[PREV : PREV + V, :V] = torch.eye(V)
        q1, k1, v1 = model.blocks[1].attn.qkv.weight.split(D)
        q1[CONTENT : CONTENT + V, :V] = 50 * sharp * torch.eye(V) / scale_1
        k1[CONTENT : CONTENT + V, PREV : PREV + V] = torch.eye(V) / scale_1
        # Position 0 has no previous token (layer 0 copies its own): keys count the previous
        # token minus the current one, so that it matches nothing.
        k1[CONTENT : CONTENT + V, :V] = -torch.eye(V) / scale_1
        v1[:V, :V] = torch.eye(V) / scale_1
        model.blocks[1].attn.out.weight[:V, :V] = 3 * torch.eye(V)
    return model


@pytest.fixture(scope="module")
def probe_batch() -> dict[str, torch.Tensor]:
    """``probe_model``'s batches: the probe batch and its control."""
    probe = {"n_sequences": 8, "max_half_length": 50, "seed": 1234}
    batch, control = make_probe_batches(V, 20, probe)
    return {"batch": batch, "control": control}


def test_a_hand_built_rotary_induction_head_scores_one(probe_batch):
    heads, summary = probe_model(rotary_induction_model(), **probe_batch, min_layer=1)
    layer_1 = heads[heads["layer"] == 1].iloc[0]
    assert layer_1["ps"] == pytest.approx(1.0, abs=1e-4)
    assert layer_1["la"] == pytest.approx(1.0, abs=1e-4)
    # With no earlier copy to find (the control), it attends about uniformly (PS 1/(p + 1),
    # 0.067 on average at s = 10): nearly all of its PS is content.
    assert layer_1["ps_content"] > 0.9 and summary["ps_content_max"] == layer_1["ps_content"]
    assert summary["ar_acc"] == 1.0 and summary["ar_rank"] == 0.0
    # Layer 0 looks one position back, not s - 1: no prefix matching there.
    assert heads[heads["layer"] == 0]["ps"].iloc[0] < 1e-3


def test_the_induction_head_needs_its_rotary_previous_token_head(probe_batch):
    # The same weights with layer 0's rotary pairs turned the other way look one position ahead
    # (masked): the previous-token head is lost, and with it the induction head.
    model = rotary_induction_model()
    with torch.no_grad():
        q0 = model.blocks[0].attn.qkv.weight[:D]
        q0[D // 2 :] *= -1
    heads, summary = probe_model(model, **probe_batch, min_layer=1)
    assert heads[heads["layer"] == 1]["ps"].iloc[0] < 0.5
    assert summary["ar_acc"] < 0.5


def test_the_exported_rotary_head_probes_alike_through_transformers(probe_batch):
    transformers = pytest.importorskip("transformers")
    from ihsweep.probing.hf import HFProbeModel
    from ihsweep.training.hf_export import hf_model

    ours = rotary_induction_model()
    theirs = hf_model(ours.cfg, ours.state_dict()).eval()
    assert isinstance(theirs, transformers.LlamaForCausalLM)
    theirs.config._attn_implementation = "eager"  # the one that returns attention weights
    want, want_summary = probe_model(ours, **probe_batch, min_layer=1)
    got, got_summary = probe_model(HFProbeModel(theirs, V), **probe_batch, min_layer=1)
    scores = [torch.tensor(table[list(HEAD_SCORES)].to_numpy()) for table in (got, want)]
    torch.testing.assert_close(*scores, rtol=0, atol=1e-6)
    assert got_summary["ar_acc"] == want_summary["ar_acc"] == 1.0


# --- the cost model knows the family ------------------------------------------------------------

LLAMA_MODELS = [
    {"n_layer": 2, "n_head": 4, "d_model": 64, "mlp": False, "n_ctx": 64, "family": "llama"},
    {"n_layer": 3, "n_head": 2, "d_model": 48, "mlp": True, "n_ctx": 100, "family": "llama"},
]


@pytest.mark.parametrize("model", LLAMA_MODELS, ids=["attention-only", "swiglu"])
def test_parameter_count_is_the_llama_models(model):
    built = GPT(GPTConfig(vocab_size=300, **model))
    assert cost.parameter_count(model, 300) == built.n_params()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mlp", [False, True], ids=["attention-only", "mlp"])
def test_flops_per_token_are_the_models_own_matmuls(family, mlp):
    # torch's FLOP counter counts every matmul of one training step (forward and backward,
    # attention as the full square it computes); RoPE's multiply-adds are not matmuls and are
    # counted by hand: 6 d per layer forward (q and k: two products and a sum), 18 d in all.
    model = {"n_layer": 2, "n_head": 4, "d_model": 48, "mlp": mlp, "n_ctx": 40, "family": family}
    vocab, batch, context = 300, 3, 40
    gpt = GPT(GPTConfig(vocab_size=vocab, **model))
    tokens = torch.randint(0, vocab, (batch, context))
    with FlopCounterMode(display=False) as counter:
        logits = gpt(tokens, explicit=True)  # attention by matmuls, the square counted
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    rope = 18 * model["n_layer"] * model["d_model"] if family == "llama" else 0
    matmuls = cost.flops_per_token(model, vocab, context) - rope
    assert counter.get_total_flops() / (batch * context) == pytest.approx(matmuls, rel=1e-9)
    if mlp:
        matrices = 3 if family == "llama" else 2
        assert cost.mlp_width(model) * matrices == pytest.approx(8 * 48, rel=0.05)


def test_an_odd_head_dimension_under_rope_is_refused_by_the_model_too():
    with pytest.raises(ValueError, match="d_head 15 is odd"):
        GPTConfig(vocab_size=10, n_ctx=8, n_layer=1, n_head=4, d_model=60, mlp=False,
                  family="llama")  # fmt: skip


def test_checkpoint_dicts_name_the_family_only_for_llama():
    gpt2 = GPTConfig(vocab_size=10, n_ctx=8, n_layer=1, n_head=2, d_model=8, mlp=False)
    llama = GPTConfig(**{**gpt2.to_dict(), "family": "llama"})
    assert set(gpt2.to_dict()) == {"vocab_size", "n_ctx", "n_layer", "n_head", "d_model", "mlp"}
    assert llama.to_dict()["family"] == "llama" and llama.to_dict()["rope_base"] == 10000.0
    assert GPTConfig(**llama.to_dict()) == llama


# --- the two families' laws side by side ---------------------------------------------------------


def two_family_table(a_llama: float, seed: int = 0):
    """test_lawfit's synthetic grid for model g (gpt2, a = 0.37) and model l (llama, a_llama)."""
    from test_lawfit import law_table

    gpt2 = law_table(seed=seed).assign(model="g")
    llama = law_table(seed=seed + 1, a=a_llama).assign(model="l")
    llama["run_id"] = "llama-" + llama["run_id"]
    return pd.concat([gpt2, llama], ignore_index=True)


def test_each_familys_law_and_their_difference_are_recovered():
    comparison = compare_families(two_family_table(0.7), {"g": "gpt2", "l": "llama"}, 400, 0)
    laws, diff = comparison["families"], comparison["differences"]["llama"]
    assert list(laws) == ["gpt2", "llama"] and comparison["reference"] == "gpt2"
    # One study (one noise draw): within 0.1 of the truth; coverage is the test below.
    assert laws["gpt2"]["a"] == pytest.approx(0.37, abs=0.1)
    assert laws["llama"]["a"] == pytest.approx(0.7, abs=0.1)
    assert diff["a"] == pytest.approx(0.33, abs=0.1) and diff["a_excludes_zero"]
    assert diff["b"] == pytest.approx(0.0, abs=0.1)
    # At the grid's centre the laws differ by what a does there: -0.33 log10 B*.
    centre = comparison["centre"]
    log_b, log_c = np.log10(centre["batch_size"]), np.log10(centre["context_size"])
    assert diff["log10_U_centre"] == pytest.approx(
        diff["log10_T"] - diff["a"] * log_b - diff["b"] * log_c
    )
    assert diff["log10_U_centre"] == pytest.approx(-0.33 * log_b, abs=0.1)
    low, high = diff["log10_U_centre_ci"]
    assert low < diff["log10_U_centre"] < high and diff["log10_U_centre_excludes_zero"]
    table = families_table(comparison)
    assert set(table["family"]) == {"gpt2", "llama", "llama - gpt2"}
    assert "log10_U_centre" in set(table["quantity"])
    row = table[(table["family"] == "llama - gpt2") & (table["quantity"] == "a")].iloc[0]
    assert row["estimate"] == pytest.approx(laws["llama"]["a"] - laws["gpt2"]["a"])


def test_the_difference_interval_covers_a_null_difference_about_95_percent():
    # Both families drawn from one law: the interval of a_llama - a_gpt2 should hold 0 in about
    # 95% of studies (independent bootstraps of two independent fits).
    held = [compare_families(two_family_table(0.37, seed=2 * k), {"g": "gpt2", "l": "llama"},
                             200, k)["differences"]["llama"]["a_excludes_zero"]
            for k in range(60)]  # fmt: skip
    assert 0.85 <= 1 - np.mean(held) <= 1.0


@pytest.mark.parametrize(
    ("metric", "says"),
    [("ps_content_max", "dated on content PS"), ("ps_max", r"date rotary models on ps\_content")],
)
def test_the_reports_paragraph_says_what_the_metric_can_date(metric, says):
    from ihsweep.report.families import family_findings

    table = two_family_table(0.7).assign(metric=metric)
    comparison = compare_families(table, {"g": "gpt2", "l": "llama"}, 100, 0)
    paragraph = family_findings({"families": comparison})
    assert says in paragraph and "llama - gpt2: a 0." in paragraph
    assert "log10 updates at the centre" in paragraph and "(the grid's centre)" in paragraph


def test_one_family_is_not_compared():
    table = two_family_table(0.37)
    assert compare_families(table, {"g": "gpt2", "l": "gpt2"}, 100, 0) is None
    assert families_table(None).empty


# --- the families study -------------------------------------------------------------------------


def test_the_families_study_dates_content_ps_and_fits_in_90_minutes():
    from ihsweep.cost.study import StudyCost

    config = REPO / "config.yaml"
    families = study_of_files([config, REPO / "workflow" / "studies" / "families.yaml"])
    default = study_of_files([config])
    by_family = {"gpt2": [], "llama": []}
    for run in families.runs:
        by_family[families.config["models"][run.model]["family"]].append(run)
    assert len(by_family["gpt2"]) == len(by_family["llama"]) == 12  # 6 cells x 2 seeds
    # One emergence rule for both families, and with it the stop rule: content PS. It is in
    # the run keys, so the gpt2 runs are the study's own, not the default study's.
    assert families.config["emergence"]["metric"] == "ps_content_max"
    paths, default_paths = StudyPaths(families), StudyPaths(default)
    shared = {str(default_paths.run_dir(run)) for run in default.runs}
    assert not {str(paths.run_dir(run)) for run in families.runs} & shared
    # Estimated at the full budgets, on 2 cores (runs stopped early take less).
    costed = StudyCost(families)
    seconds = sum(costed.train_seconds(run) for run in families.runs)
    assert seconds / 2 / 60 < 90
