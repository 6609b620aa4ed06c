"""Exporting our checkpoints as Hugging Face folders, GPT-2's or Llama's by family
(ihsweep.training.hf_export, and its command ihsweep.steps.export).

The checkpoints are test_train's toy runs (its dataset and spec helpers, 30 updates in process on
one CPU thread), of both families, with and without MLP, and a copy of each with its weights redrawn
large, so that a wrong layout or the tanh GELU would show in the logits. The exported folder is
loaded
by ``transformers`` alone and must give our logits, and, probed through
``ihsweep.probing.hf``, our own probe tables: the loop from our checkpoints to the Hugging Face
probes closes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ihsweep.files.layout import EXPORT_SPEC  # noqa: E402
from ihsweep.probing.run import probe_checkpoint  # noqa: E402
from ihsweep.steps import export, probe_suite  # noqa: E402
from ihsweep.training.checkpoints import list_checkpoints  # noqa: E402
from ihsweep.training.hf_export import export_checkpoint, find_checkpoint  # noqa: E402
from ihsweep.training.loop import train  # noqa: E402
from ihsweep.training.model import GPT, GPTConfig  # noqa: E402
from ihsweep.training.weights import load_checkpoint_weights, save_checkpoint  # noqa: E402
from test_train import CPU, C, V, make_dataset, make_spec  # noqa: E402

PROBE = {"n_sequences": 20, "max_half_length": 50, "seed": 1234, "min_layer": 1}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


MODELS = {
    "attention-only": {"mlp": False},
    "mlp": {"mlp": True},
    "llama-attention-only": {"mlp": False, "family": "llama"},
    "llama-swiglu": {"mlp": True, "family": "llama", "rope_base": 500},
}


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def run_dir(request, tmp_path_factory, data_dir) -> Path:
    """A trained toy run of 4 heads, its one checkpoint at step 30."""
    spec = make_spec(steps=30, every=30, model={**MODELS[request.param], "n_head": 4})
    run_dir = tmp_path_factory.mktemp("run") / "run"
    train(spec, data_dir, run_dir, CPU)
    return run_dir


def ours(meta: dict) -> GPT:
    model = GPT(GPTConfig(**meta["model_config"]))
    model.load_state_dict(load_checkpoint_weights(meta))
    return model.eval()


def large_copy(meta: dict, root: Path) -> dict:
    """The checkpoint with every weight but the LayerNorms' redrawn large, saved as one of ours."""
    model = ours(meta)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.5)
    extra = {"weights", "weights_sha256", "step"}
    save_checkpoint(root, meta["step"], model, {k: v for k, v in meta.items() if k not in extra})
    (large,) = list_checkpoints(root)
    return large


def checkpoints(run_dir: Path, root: Path) -> dict[str, dict]:
    trained = find_checkpoint(run_dir)
    return {"trained": trained, "large": large_copy(trained, root / "large_run")}


@torch.no_grad()
def test_exported_folder_gives_our_logits(run_dir, tmp_path):
    tokens = torch.randint(0, V, (4, C), generator=torch.Generator().manual_seed(0))
    for kind, meta in checkpoints(run_dir, tmp_path).items():
        out = export_checkpoint(meta, tmp_path / "hf" / kind)
        names = {p.name for p in out.iterdir()} - {"generation_config.json"}  # transformers'
        assert names == {"config.json", "model.safetensors", EXPORT_SPEC}
        hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        family = GPTConfig(**meta["model_config"]).family
        assert type(hf).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[family]
        want = ours(meta)(tokens)
        got = hf(input_ids=tokens).logits
        assert want.std() > (1e-2 if kind == "trained" else 1.0), kind  # not a trivial model
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

        provenance = json.loads((out / EXPORT_SPEC).read_text())
        assert provenance["spec"] == meta["spec"] and provenance["step"] == meta["step"] == 30
        assert provenance["weights_sha256"] == meta["weights_sha256"]
        assert provenance["exported_from"] == str(Path(meta["weights"]).resolve())

    if family == "llama":
        return
    # The tanh approximation GPT-2 uses by default would not be our model (with an MLP).
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf" / "large")
    assert config.activation_function == "gelu"
    config.activation_function = "gelu_new"
    tanh = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "hf" / "large", config=config
    )
    differ = (tanh(input_ids=tokens).logits - ours(meta)(tokens)).abs().max().item()
    assert (differ > 1e-3) == GPTConfig(**meta["model_config"]).mlp


def test_probing_the_export_as_a_suite_gives_our_probe_tables(run_dir, tmp_path):
    # Each export is the one revision (step30) of a local suite, probed by the suite step.
    for kind, meta in checkpoints(run_dir, tmp_path).items():
        want = probe_checkpoint(meta, PROBE, torch.device("cpu"))
        export_checkpoint(meta, tmp_path / kind / f"step{meta['step']}")
        spec = meta["spec"]
        suite = {"model": str(tmp_path / kind), "revisions": [f"step{meta['step']}"],
                 "batch_size": spec["batch_size"], "context_size": spec["context_size"],
                 "vocab_size": V}  # fmt: skip
        out = tmp_path / kind / "probes"
        argv = ["--name", kind, "--suite", json.dumps(suite), "--probe", json.dumps(PROBE),
                "--heads", str(out / "heads.parquet"), "--model-table", str(out / "model.parquet"),
                "--device", "cpu"]  # fmt: skip
        assert probe_suite.main(argv) == 0
        heads, model = (pd.read_parquet(out / f"{t}.parquet") for t in ("heads", "model"))
        assert len(heads) == 2 * 4 and model["tokens"].tolist() == [meta["tokens"]]
        if kind == "large":  # a comparison with teeth
            assert want["ps"].std() > 1e-3 and want["la"].std() > 1e-3
        np.testing.assert_allclose(heads["ps"], want["ps"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(heads["la"], want["la"], rtol=0, atol=1e-5)
        assert model["ar_acc"].iat[0] == pytest.approx(want["ar_acc"].iat[0], abs=1e-12)
        assert model["ar_rank"].iat[0] == pytest.approx(want["ar_rank"].iat[0], abs=1e-12)


def test_command_exports_a_run_or_a_checkpoint_and_refuses_a_foreign_folder(
    run_dir, tmp_path, capsys
):
    (meta,) = list_checkpoints(run_dir)
    main = export.main  # python -m ihsweep.steps.export, the rule's command
    assert main([str(run_dir), str(tmp_path / "a")]) == 0
    assert main([meta["weights"].removesuffix(".safetensors") + ".json", str(tmp_path / "b")]) == 0
    assert main([str(run_dir), str(tmp_path / "a"), "--step", "30"]) == 0  # replaces its export
    for folder in ("a", "b"):
        assert (tmp_path / folder / "model.safetensors").read_bytes() == (
            tmp_path / "a" / "model.safetensors"
        ).read_bytes()
    assert "exported step 30" in capsys.readouterr().out

    assert main([str(run_dir), str(tmp_path / "c"), "--step", "7"]) == 1
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main([str(run_dir), str(foreign)]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "is not an export of ours" in err
    assert (foreign / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".*.tmp"))
