"""bench/gpu_plan.py, the one command of GPU measurements, run as ``--smoke`` on the CPU: every
phase writes the JSON, the variants pass the correctness check against eager (and a wrong loss
fails it), the profile is one ``execution.device_profile`` accepts, and the projection of
paper.yaml is the cost model's on that profile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, SCHEMA
from ihsweep import cost
from ihsweep.cost.report import cost_table
from ihsweep.cost.study import StudyCost
from ihsweep.training.lm_head import padded_unembedding
from ihsweep.validate import prepare

sys.path.insert(0, str(REPO / "bench"))
import gpu_plan  # noqa: E402


@pytest.mark.slow
def test_smoke_plan_writes_every_phase(tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "bench/gpu_plan.py", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["errors"] == []
    assert record["environment"]["matmul_tflops"] > 0
    assert [c["variant"] for c in record["checks"]] == list(gpu_plan.VARIANTS[1:])
    assert all(c["passed"] for c in record["checks"])
    timed = {(r["variant"], tuple(r["cell"])) for r in record["cells"]}
    assert timed == {("eager", (4, 16)), ("eager", (8, 32))} | {
        (v, (4, 16)) for v in gpu_plan.VARIANTS[1:]
    }
    assert all(r["tokens_per_second"] > 0 and 0 < r["mfu_measured"] for r in record["cells"])
    assert [p["processes"] for p in record["packing"]] == [1, 2]
    # The eager fit is a device profile the cost model reads.
    execution = {"device_profile": str(out), "device": "auto", "gpu": 1, "gpu_model": None}
    profile = cost.device_profile(execution)
    assert profile["peak_tflops"] == record["environment"]["matmul_tflops"]
    # The paths a GPU job's auto reads: each variant's settings, check and speed-up per cell.
    paths = record["paths"]
    assert paths["device"] == record["environment"]["device"]
    assert set(paths["variants"]) == set(gpu_plan.VARIANTS[1:])
    fused = paths["variants"]["padded-fused"]
    assert fused["settings"] == {"compile": False, "vocab_padding": 64, "fused_loss": True}
    assert fused["correct"] and list(fused["speedup"]) == ["4x16"] and fused["speedup"]["4x16"] > 0
    # paper.yaml projected on each variant's fit: early stop trains a quarter of the tokens.
    projection = record["projection"]
    assert set(projection) == set(gpu_plan.VARIANTS)
    eager = projection["eager"]
    paper = prepare(yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text()), SCHEMA)
    assert eager["tokens"] == cost_table(StudyCost(paper)).tokens.sum()  # the runs' whole steps
    assert 0.15 < eager["early_stop_tokens"] / eager["tokens"] < 0.35
    assert eager["early_stop_device_hours"] < 0.5 * eager["device_hours"]
    assert "paper.yaml on eager" in proc.stdout
    # --project redoes phase 6 from the file alone, to the same numbers.
    proc = subprocess.run(
        [sys.executable, "bench/gpu_plan.py", "--project", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["projection"] == projection


@pytest.mark.parametrize("variant", ["compiled", "padded", "fused"])
def test_a_wrong_variant_fails_the_check(variant):
    plan = {**gpu_plan.PLANS["smoke"], "name": "smoke"}
    device = torch.device("cpu")
    assert gpu_plan.compare_to_eager(variant, plan, device)["passed"]
    if variant == "padded":  # the softmax over the padding too: the wrong distribution

        def wrong(model, x, autocast):
            W_U = padded_unembedding(model.W_U, plan["pad_to"])
            logits = model.features(x[:, :-1]) @ W_U.T
            return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())

    else:  # a loss off by 0.1%
        own = gpu_plan.variant_path(variant, plan).loss_fn(backend=plan["backend"])

        def wrong(model, x, autocast):
            return 1.001 * own(model, x, autocast)

    row = gpu_plan.compare_to_eager(variant, plan, device, loss_fn=wrong)
    assert not row["passed"]
    assert row["loss_abs_diff"] > plan["tolerance"]["loss"]
