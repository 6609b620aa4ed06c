"""Checkpoint suites that are not what their names say (ihsweep.probing.fingerprints,
ihsweep.analysis.duplicates): local suites of tiny ``transformers`` models whose revisions are
saved from the same weights, in other file layouts, or with some tensors copied from another
revision, through the probe step, the emergence analysis, status and the suite's report page."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from ihsweep.analysis.duplicates import (  # noqa: E402
    DUPLICATE_COLUMNS,
    fitted_revisions,
    mark_undetermined,
    read_duplicates,
)
from ihsweep.config import StudyPaths  # noqa: E402
from ihsweep.files import layout  # noqa: E402
from ihsweep.files.io import DamagedFile  # noqa: E402
from ihsweep.probing.fingerprints import FINGERPRINT_COLUMNS, compact  # noqa: E402
from ihsweep.probing.hf import probe_hf  # noqa: E402
from ihsweep.status import main as status  # noqa: E402
from ihsweep.steps import aggregate_natural  # noqa: E402
from ihsweep.steps import probe_suite as step  # noqa: E402
from ihsweep.steps.prepare import prepare  # noqa: E402
from test_hf import PROBE, C, V, tiny  # noqa: E402

B = 8
STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)  # enough checkpoints to date a transition
EMERGENCE = {"min_rise": 0.01}  # the tiny random models' ps_max moves by a few hundredths


def draw(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Redraw every parameter (norms around 1: none constant) and return the weights."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.4)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def put(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])


def spec(root: Path, steps=STEPS, **overrides) -> dict:
    revisions = [f"step{s}" for s in steps]
    return {"model": str(root), "revisions": revisions, "batch_size": B, "context_size": C,
            "vocab_size": V} | overrides  # fmt: skip


def probe_step(out: Path, suite: dict, name: str = "tiny") -> Path:
    """Run the probe step into ``out``; the folder of its tables."""
    argv = ["--name", name, "--suite", json.dumps(suite), "--probe", json.dumps(PROBE),
            "--heads", str(out / "heads.parquet"), "--model-table", str(out / "model.parquet"),
            "--device", "cpu", "--threads", "1"]  # fmt: skip
    assert step.main(argv) == 0
    return out


def aggregate(probes: Path, out: Path, *extra: str) -> pd.DataFrame:
    argv = ["--model-tables", str(probes / "model.parquet"), "--emergence",
            json.dumps(EMERGENCE), "--out-dir", str(out), *extra]  # fmt: skip
    assert aggregate_natural.main(argv) == 0
    return pd.read_csv(out / "emergence.csv")


def duplicates(probes: Path) -> pd.DataFrame:
    return pd.read_csv(probes / layout.DUPLICATES, dtype=str, keep_default_na=False)


def test_one_weights_in_three_file_layouts_are_one_group(tmp_path):
    model = tiny("gpt_neox")
    root = tmp_path / "suite"
    draw(model, 0)
    model.save_pretrained(root / "step0")
    draw(model, 1)
    model.save_pretrained(root / "step1")  # one safetensors file
    model.save_pretrained(root / "step2", max_shard_size="20KB")  # sharded
    model.config.save_pretrained(root / "step4")  # a PyTorch .bin, as older uploads are
    torch.save(model.state_dict(), root / "step4" / "pytorch_model.bin")
    draw(model, 2)
    model.save_pretrained(root / "step8")
    assert len(list((root / "step2").glob("*.safetensors"))) > 1
    assert not list((root / "step4").glob("*.safetensors"))

    probes = probe_step(tmp_path / "probes", spec(root, (0, 1, 2, 4, 8)))
    groups = duplicates(probes)
    assert list(groups.columns) == DUPLICATE_COLUMNS
    (group,) = groups.to_dict("records")
    n = len(list(model.parameters()))
    assert group == {
        "suite": "tiny", "kind": "identical", "revisions": "step1 step2 step4",
        "steps": "1 2 4", "n_tensors": str(n), "tensors": "*",
        "line": f"tiny: step1, step2, step4 (steps 1, 2, 4) hold identical weights (all {n} "
                "parameter tensors)",
    }  # fmt: skip
    prints = pd.read_parquet(probes / layout.FINGERPRINTS)
    assert list(prints.columns) == FINGERPRINT_COLUMNS
    assert len(prints) == 5 * n  # trained parameters only: no rotary inv_freq buffer
    assert not prints["parameter"].str.contains("inv_freq|rotary").any()
    whole = prints.drop_duplicates("revision").set_index("revision")["revision_sha256"]
    assert whole.nunique() == 3 and whole["step1"] == whole["step2"] == whole["step4"]
    page = (probes / layout.DUPLICATES_PAGE).read_text()
    assert "Duplicate revisions of tiny" in page and "step1, step2, step4" in page


def test_a_revision_with_the_last_ones_embedding_and_first_layer_is_flagged(tmp_path, capsys):
    model = tiny("gpt_neox")
    root = tmp_path / "suite"
    last = draw(model, 3)
    for seed, s in enumerate((0, 1, 2)):
        weights = draw(model, 10 + seed)
        if s == 1:  # as pythia#206: the first shard is the final checkpoint's
            copied = {k: v for k, v in last.items() if ".embed_in." in k or ".layers.0." in k}
            put(model, weights | copied)
        model.save_pretrained(root / f"step{s}")
    put(model, last)
    model.save_pretrained(root / "step3")

    probes = probe_step(tmp_path / "probes", spec(root, (0, 1, 2, 3)))
    (group,) = duplicates(probes).to_dict("records")
    n = len(list(model.parameters()))
    assert group["kind"] == "shared" and group["revisions"] == "step1 step3"
    assert group["tensors"] == "gpt_neox.embed_in.weight gpt_neox.layers.0.*"
    assert group["n_tensors"] == str(len(copied))
    assert group["line"] == (
        f"tiny: step1, step3 (steps 1, 3) share {len(copied)} of {n} parameter tensors: "
        "gpt_neox.embed_in.weight, gpt_neox.layers.0.*"
    )
    assert f"duplicate revisions: {group['line']}" in capsys.readouterr().out


def rising_suite(model: torch.nn.Module, root: Path, copies: dict[int, int] | None = None) -> None:
    """Random revisions named in the order of their ps_max, so that ps_max rises and the
    transition is dated; ``copies`` {step: step} saves a step from another's weights."""
    draws = []
    for seed in range(len(STEPS)):
        weights = draw(model, seed)
        draws.append((probe_hf(model, V, C, PROBE)[1]["ps_max"], seed, weights))
    weights = {s: w for s, (*_, w) in zip(STEPS, sorted(draws, key=lambda d: d[:2]), strict=True)}
    for s in STEPS:
        put(model, weights[(copies or {}).get(s, s)])
        model.save_pretrained(root / f"step{s}")


def test_a_suite_whose_early_revisions_equal_its_last_is_undetermined(tmp_path):
    root = tmp_path / "suite"
    rising_suite(tiny("gpt_neox"), root, copies={0: 256, 1: 256})
    probes = probe_step(tmp_path / "probes", spec(root))
    (group,) = duplicates(probes).to_dict("records")
    assert group["revisions"] == "step0 step1 step256" and group["kind"] == "identical"

    out = tmp_path / "natural"
    argv = ("--suite-duplicates", str(probes / layout.DUPLICATES))
    (row,) = aggregate(probes, out, *argv).to_dict("records")
    assert row["emerged"] is False or row["emerged"] == False  # noqa: E712
    assert pd.isna(row["tokens_pt"]) and pd.isna(row["updates_pt"])
    assert row["reason"] == (
        f"undetermined: a step-0 revision shares weights with a trained one ({group['line']})"
    )
    assert ">undetermined<" in (out / "emergence.html").read_text()
    # Kept knowingly, the step-0 revision still leaves the point undetermined.
    kept = aggregate(probes, tmp_path / "kept", *argv, "--keep-duplicates", '["tiny"]')
    assert kept["reason"].iat[0] == row["reason"]


def test_a_clean_suites_tables_and_emergence_point_are_unchanged(tmp_path):
    root = tmp_path / "suite"
    rising_suite(tiny("gpt_neox"), root)
    probes = probe_step(tmp_path / "probes", spec(root))
    assert duplicates(probes).empty
    assert "No two revisions share" in (probes / layout.DUPLICATES_PAGE).read_text()
    before = aggregate(probes, tmp_path / "without")  # the aggregate as it was: no groups given
    after = aggregate(
        probes, tmp_path / "with", "--suite-duplicates", str(probes / "duplicates.csv")
    )
    assert bool(before["emerged"].iat[0])  # a dated transition, unchanged
    for name in ("emergence.csv", "lawfit.json", "emergence.html"):
        assert (tmp_path / "with" / name).read_bytes() == (tmp_path / "without" / name).read_bytes()
    pd.testing.assert_frame_equal(before, after)


def test_duplicates_are_left_out_of_the_fit_unless_kept_and_spanning_groups_undetermined():
    model_table = pd.DataFrame({"model": ["s"] * 4 + ["r"] * 2, "step": [0, 1, 2, 3, 1, 2]})
    groups = pd.DataFrame(
        [["s", "identical", "step1 step3", "1 3", "5", "*", "s: step1, step3 ..."]],
        columns=DUPLICATE_COLUMNS,
    )
    assert fitted_revisions(model_table, groups, [])["step"].tolist() == [0, 2, 1, 2]
    assert fitted_revisions(model_table, groups, ["s"]) is model_table
    assert fitted_revisions(model_table, groups.iloc[:0], []) is model_table

    row = {"model": "s", "batch_size": 2, "context_size": 5, "emerged": True, "reason": "",
           "tokens_pt": 20.0, "tokens_lo": 10.0, "tokens_hi": 30.0, "updates_pt": 2.0,
           "updates_lo": 1.0, "updates_hi": 3.0, "predicted_within": None}  # fmt: skip
    spanning = mark_undetermined(pd.DataFrame([row]), groups).iloc[0]  # steps 1 and 3 around 2
    assert not spanning["emerged"] and pd.isna(spanning["tokens_pt"])
    assert spanning["reason"] == (
        "undetermined: duplicate revisions span the transition at 20 tokens (s: step1, step3 ...)"
    )
    after = pd.DataFrame([row | {"tokens_pt": 40.0}])  # the group lies before the point
    pd.testing.assert_frame_equal(mark_undetermined(after, groups), after)


def test_a_damaged_duplicates_file_is_named(tmp_path):
    damaged = tmp_path / "duplicates.csv"
    damaged.write_bytes(b"\x00\x01 not, a table\n")
    with pytest.raises(DamagedFile, match=r"^damaged duplicate groups .*duplicates\.csv: missing"):
        read_duplicates([damaged])


def test_compact_names_whole_modules():
    every = ["emb.weight", "l.0.a.weight", "l.0.a.bias", "l.0.b.weight", "l.1.a.weight"]
    assert compact(["emb.weight", "l.0.a.weight", "l.0.a.bias", "l.0.b.weight"], every) == [
        "emb.weight", "l.0.*",
    ]  # fmt: skip
    assert compact(["l.0.a.weight", "l.0.a.bias"], every) == ["l.0.a.*"]
    assert compact(["l.0.a.weight"], every) == ["l.0.a.weight"]


def test_status_names_the_groups_and_keep_duplicates_moves_no_folder(tmp_path, monkeypatch, capsys):
    model = tiny("gpt2")
    root = tmp_path / "suite"
    draw(model, 0)
    for s in (0, 1):
        model.save_pretrained(root / f"step{s}")
    draw(model, 1)
    model.save_pretrained(root / "step2")
    config = {"suites": {"tiny": spec(root, (0, 1, 2))}, "probe": PROBE}
    kept = {"suites": {"tiny": spec(root, (0, 1, 2), keep_duplicates=True)}, "probe": PROBE}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))  # prepare fills it in
    paths, kept_paths = StudyPaths(prepare(config)), StudyPaths(prepare(kept))
    assert kept_paths.suite_dir("tiny") == paths.suite_dir("tiny")
    probes = tmp_path / Path(paths.suite_table("heads", "tiny")).parent
    probe_step(probes, spec(root, (0, 1, 2)))
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert status(["--configfile", "config.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    heading = lines.index("duplicate revisions (left out of the emergence fit unless kept):")
    assert lines[heading + 1] == (
        "  tiny: step0, step1 (steps 0, 1) hold identical weights (all "
        f"{len(list(model.parameters()))} parameter tensors)"
    )
