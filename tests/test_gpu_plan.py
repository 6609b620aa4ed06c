"""bench/gpu_plan.py, the one command of GPU measurements, run as ``--smoke`` on the CPU: every
phase writes the JSON, the variants pass the correctness check against eager (and a wrong loss
fails it), the profile is one ``execution.device_profile`` accepts, and the projection of
paper.yaml is the cost model's on that profile."""

from __future__ import annotations

import json
import platform
import shlex
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
from ihsweep.training.execution import resolve_step_path
from ihsweep.training.lm_head import HeadPath, padded_unembedding
from ihsweep.training.step import StepPath
from ihsweep.validate import prepare

sys.path.insert(0, str(REPO / "bench"))
import gpu_plan  # noqa: E402


@pytest.mark.slow
def test_smoke_plan_writes_every_phase(tmp_path):
    """The smoke reaches the real paths: GPT-2's vocabulary at 4 x 167 positions, so that the
    chunked, padded and fused losses run in three slices (333, 333, 2: cost.loss_chunk_rows on
    the CPU), and the compiled variant through inductor. Its first run compiles for about two
    minutes on two busy cores (past the default deadline when they are very busy); later runs
    load inductor's cache."""
    out = tmp_path / "plan.json"
    proc = subprocess.run(  # a deadline that a first compile on busy cores still meets
        [sys.executable, "bench/gpu_plan.py", "--smoke", "--out", str(out), "--minutes", "15"],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["errors"] == []
    assert record["environment"]["matmul_tflops"] > 0
    # Checked cheapest first, each before its first row: the compiled variant last.
    checked = [c["variant"] for c in record["checks"]]
    assert checked == ["padded", "fused", "padded-fused", "compiled"]
    assert all(c["passed"] for c in record["checks"])
    # Every path's lm head ran in three slices, as the profiler saw its GEMMs.
    assert {c["variant"]: c["logit_slices"] for c in record["checks"]} == {
        v: [333, 333, 2] for v in ("padded", "fused", "padded-fused", "compiled")
    }
    rows = {(r["variant"], tuple(r["cell"])): r for r in record["cells"]}
    variants = gpu_plan.PLANS["smoke"]["variants"]
    assert set(rows) == {("eager", (2, 32))} | {(v, (4, 168)) for v in variants}
    assert all(r["status"] == "measured" for r in rows.values())
    assert all(r["tokens_per_second"] > 0 and 0 < r["mfu_measured"] for r in rows.values())
    # inductor compiled the compiled variant (or loaded it from its cache), and nothing else.
    assert rows["compiled", (4, 168)]["inductor_graphs"] > 0
    assert all(r["inductor_graphs"] == 0 for (v, _), r in rows.items() if v != "compiled")
    assert [p["processes"] for p in record["packing"]] == [1, 2]
    # The eager fit is a device profile the cost model reads.
    execution = {"device_profile": str(out), "device": "auto", "gpu": 1, "gpu_model": None}
    profile = cost.device_profile(execution)
    assert profile["peak_tflops"] == record["environment"]["matmul_tflops"]
    # The paths a GPU job's auto reads: the cells eager was measured at, and each variant's
    # settings, check and speed-up per cell.
    paths = record["paths"]
    assert paths["device"] == record["environment"]["device"]
    assert paths["cells"] == ["2x32", "4x168"]
    assert set(paths["variants"]) == set(variants[1:])
    fused = paths["variants"]["padded-fused"]
    assert fused["settings"] == {"compile": False, "vocab_padding": 64, "fused_loss": True}
    assert fused["correct"] and list(fused["speedup"]) == ["4x168"]
    assert fused["speedup"]["4x168"] > 0
    # paper.yaml projected on each variant's fit: early stop trains a quarter of the tokens.
    projection = record["projection"]
    assert set(projection) == set(variants)
    eager = projection["eager"]
    paper = prepare(yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text()), SCHEMA)
    assert eager["tokens"] == cost_table(StudyCost(paper)).tokens.sum()  # the runs' whole steps
    assert 0.15 < eager["early_stop_tokens"] / eager["tokens"] < 0.35
    assert eager["early_stop_device_hours"] < 0.5 * eager["device_hours"]
    assert "paper.yaml on eager" in proc.stdout
    # The baseline first, then packing, then the variants.
    lines = proc.stdout.splitlines()
    first = [next(i for i, line in enumerate(lines) if line.startswith(start))
             for start in ("(4, 168)     eager", "packing 1", "check padded ")]  # fmt: skip
    assert first == sorted(first)
    # --project redoes phase 6 from the file alone, to the same numbers.
    proc = subprocess.run(
        [sys.executable, "bench/gpu_plan.py", "--project", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["projection"] == projection


@pytest.mark.parametrize("variant", ["compiled", "padded", "fused"])
def test_a_wrong_variant_fails_the_check(variant):
    # a tiny vocabulary and TorchDynamo's eager backend: the check, not the paths, under test
    tiny = {"vocab": 257, "cells": [(8, 32)], "check_cell": (8, 32), "backend": "eager"}
    plan = {**gpu_plan.PLANS["smoke"], **tiny, "name": "smoke"}
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


# --------------------------------------------------------------------------------------------
# auto on hand-made plan files: a path only where this plan measured it, 1.1x over eager


def plan_file(ms: dict, failed=(), not_attempted=(), wrong=()) -> dict:
    """A plan's record as bench/gpu_plan.py writes it: ``ms`` {(variant, cell): ms per step}
    measured, then rows that failed or were not attempted, checks failed for ``wrong``."""
    rows = [{"variant": v, "cell": list(c), "status": "measured", "ms_per_step": t}
            for (v, c), t in ms.items()]  # fmt: skip
    rows += [{"variant": v, "cell": list(c), "status": "failed: timed out after 150 s"}
             for v, c in failed]  # fmt: skip
    rows += [{"variant": v, "cell": list(c), "status": gpu_plan.OUT_OF_TIME}
             for v, c in not_attempted]  # fmt: skip
    checks = [{"variant": v, "passed": v not in wrong} for v in gpu_plan.VARIANTS[1:]]
    record = {"plan": "gpu", "environment": {"device": "NVIDIA H100 80GB HBM3"},
              "checks": checks, "cells": rows}  # fmt: skip
    return json.loads(json.dumps({**record, "paths": gpu_plan.measured_paths(record)}))


AUTO = {"compile": "auto", "vocab_padding": "auto", "fused_loss": "auto"}
SMALL, MID, LARGE = (8, 64), (32, 256), (256, 1024)
EAGER = {("eager", SMALL): 10.0, ("eager", MID): 20.0, ("eager", LARGE): 400.0}


def auto(record: dict, B: int, C: int, settings=AUTO) -> StepPath:
    return resolve_step_path(settings, B, C, record["paths"])


def test_a_path_missing_at_the_nearest_cell_is_not_borrowed_from_another():
    """The compiled check ran out of time before (256, 1024): a job there stays eager, though
    compiled is 3x at (32, 256); at (32, 256) itself it compiles."""
    record = plan_file(
        {**EAGER, ("compiled", SMALL): 5.0, ("compiled", MID): 6.0},
        not_attempted=[("compiled", LARGE)],
    )
    assert record["paths"]["cells"] == ["8x64", "32x256", "256x1024"]
    assert auto(record, 256, 1024) == StepPath()
    assert auto(record, 128, 1024) == StepPath()  # nearest measured cell: 256x1024
    assert auto(record, 32, 256) == StepPath(compile=True)


def test_an_errored_row_counts_as_not_faster():
    record = plan_file(
        {**EAGER, ("padded", SMALL): 5.0, ("padded", MID): 10.0, ("compiled", MID): 5.0},
        failed=[("padded", LARGE), ("compiled", LARGE)],
    )
    assert auto(record, 256, 1024) == StepPath()
    assert auto(record, 32, 256) == StepPath(compile=True)  # 4x beats padded's 2x


def test_a_speedup_below_1_1_keeps_the_plain_path():
    record = plan_file({**EAGER, ("padded", LARGE): 400 / 1.05, ("fused", LARGE): 400 / 1.1})
    assert record["paths"]["variants"]["padded"]["speedup"]["256x1024"] == 1.05
    assert auto(record, 256, 1024) == StepPath(head=HeadPath(1, True))  # 1.1 is enough
    slower = plan_file({**EAGER, ("padded", LARGE): 400 / 1.05, ("fused", LARGE): 400 / 1.09})
    assert auto(slower, 256, 1024) == StepPath()


def test_a_fixed_setting_stays_and_the_autos_follow_what_agrees_with_it():
    record = plan_file(
        {**EAGER, ("compiled", LARGE): 100.0, ("padded-fused", LARGE): 200.0,
         ("padded", LARGE): 390.0},
        wrong=["fused"],
    )  # fmt: skip
    assert auto(record, 256, 1024) == StepPath(compile=True)
    assert auto(record, 256, 1024, {**AUTO, "compile": False}) == StepPath(head=HeadPath(64, True))
    # padded alone is 1.03x: with fused_loss set, vocab_padding stays at its plain value
    assert auto(record, 256, 1024, {**AUTO, "compile": False, "fused_loss": False}) == StepPath()
    # fused alone failed its check: padded-fused is the fastest that agrees
    assert auto(record, 256, 1024, {**AUTO, "fused_loss": True}) == StepPath(
        head=HeadPath(64, True)
    )
    # no measured path agrees with a padding of 128: taken as set, the other autos plain
    assert auto(record, 256, 1024, {**AUTO, "vocab_padding": 128}) == StepPath(head=HeadPath(128))


# --------------------------------------------------------------------------------------------
# The parent: a child's bad output costs its row; --resume measures what a file lacks


class NoisyPlan(gpu_plan.Plan):
    """The smoke plan whose children, real processes, print stray lines: the environment's
    worker one after its result, the (2, 32) eager row's child nothing else, the (4, 168)
    one's a result cut off mid-line."""

    def command(self, task: dict) -> list[str]:
        real = shlex.join(super().command(task))
        if task["kind"] == "env":
            return ["sh", "-c", f"{real}; echo 'a stray line'"]
        if task["cell"] == [2, 32]:
            return ["sh", "-c", "echo 'a stray line'"]
        return ["sh", "-c", "echo " + shlex.quote(gpu_plan.RESULT + '{"variant": "eag')]


def test_a_childs_malformed_output_is_its_rows_error_and_the_plan_goes_on(tmp_path):
    plan = NoisyPlan("smoke", tmp_path / "plan.json", minutes=5)
    assert gpu_plan.phase_environment(plan)  # its result line found among the stray ones
    gpu_plan.phase_baseline(plan)
    record = json.loads((tmp_path / "plan.json").read_text())
    rows = {tuple(r["cell"]): r["status"] for r in record["cells"] if r["variant"] == "eager"}
    assert rows[2, 32] == "failed: malformed output: no result line; its last line: 'a stray line'"
    assert rows[4, 168].startswith("failed: malformed output: Unterminated string")
    assert [e["task"]["cell"] for e in record["errors"]] == [[2, 32], [4, 168]]
    # The rows not reached yet are there, marked.
    assert {r["status"] for r in record["cells"] if r["variant"] != "eager"} == {
        gpu_plan.OUT_OF_TIME
    }


def test_the_variants_go_cheapest_first_those_that_compile_last():
    plan = gpu_plan.Plan("gpu", None, minutes=1)
    eager_mode = ["padded", "fused", "padded-fused"]
    compiling = ["compiled", "padded-compiled"]
    cells = [(8, 64), (32, 256), (256, 1024)]
    assert gpu_plan.variant_order(plan) == [(v, c) for c in cells for v in eager_mode] + [
        (v, c) for c in cells for v in compiling
    ]


class StrayChecks(gpu_plan.Plan):
    """The GPU plan whose check children, real processes, print a stray line and no result."""

    def command(self, task: dict) -> list[str]:
        assert task["kind"] == "check"
        return ["sh", "-c", "echo 'a stray line'"]


def test_a_variant_whose_check_fails_to_run_is_not_timed_and_checked_once(tmp_path):
    plan = StrayChecks("gpu", tmp_path / "plan.json", minutes=5)
    gpu_plan.phase_variants(plan)
    record = json.loads((tmp_path / "plan.json").read_text())
    variants = gpu_plan.VARIANTS[1:]
    assert [e["task"]["variant"] for e in record["errors"]] == [
        "padded", "fused", "padded-fused", "compiled", "padded-compiled"
    ]  # fmt: skip
    rows = [r for r in record["cells"] if r["variant"] in variants]
    assert len(rows) == 3 * len(variants)
    assert {r["status"] for r in rows} == {
        "not timed: its check failed to run: malformed output: no result line;"
        " its last line: 'a stray line'"
    }


def measured_smoke_file(path, device: str) -> dict:
    """A smoke plan's file with every row measured (made-up numbers) but eager at (2, 32)."""
    smoke = gpu_plan.PLANS["smoke"]
    fpt = cost.flops_per_token({**smoke["model"], "n_ctx": 168}, smoke["vocab"], 168)
    rows = [
        {"variant": v, "cell": [4, 168], "status": "measured", "ms_per_step": 100.0 + i,
         "passes": 1, "flops_per_token": fpt}
        for i, v in enumerate(smoke["variants"])
    ]  # fmt: skip
    rows.append({"variant": "eager", "cell": [2, 32], "status": "failed: timed out after 60 s"})
    packing = [
        {
            "processes": n,
            "cell": [2, 32],
            "tokens_per_second": 500.0 * n,
            "per_process": [500.0] * n,
        }
        for n in smoke["pack"]
    ]
    environment = {"device": device, "memory_gb": None, "matmul_tflops": 0.1}
    record = {
        "plan": "smoke",
        "environment": {**environment, "vendor_peak_tflops": None},
        "checks": [{"variant": v, "passed": True} for v in smoke["variants"][1:]],
        "cells": rows,
        "packing": packing,
        "errors": [{"task": {"kind": "time"}, "error": "timed out after 60 s"}],
    }
    path.write_text(json.dumps(record))
    return record


def test_resume_measures_only_the_rows_a_file_lacks(tmp_path):
    this_cpu = platform.processor() or "cpu"  # what task_env names this machine
    before = measured_smoke_file(tmp_path / "plan.json", this_cpu)
    proc = subprocess.run(
        [sys.executable, "bench/gpu_plan.py", "--resume", str(tmp_path / "plan.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = json.loads((tmp_path / "plan.json").read_text())
    rows = {(r["variant"], tuple(r["cell"])): r for r in after["cells"]}
    assert rows["eager", (2, 32)]["status"] == "measured"
    assert rows["eager", (2, 32)]["ms_per_step"] > 0
    kept = [r for r in before["cells"] if r["status"] == "measured"]
    assert [rows[r["variant"], tuple(r["cell"])] for r in kept] == kept
    assert after["checks"] == before["checks"] and after["packing"] == before["packing"]
    assert after["environment"] == before["environment"]
    assert after["errors"] == before["errors"]  # this run's one task went well


def test_resume_refuses_a_file_of_another_device(tmp_path):
    before = measured_smoke_file(tmp_path / "plan.json", "NVIDIA H100 80GB HBM3")
    proc = subprocess.run(
        [sys.executable, "bench/gpu_plan.py", "--resume", str(tmp_path / "plan.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"{tmp_path / 'plan.json'} was measured on NVIDIA H100 80GB HBM3" in proc.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["cells"] == before["cells"]
