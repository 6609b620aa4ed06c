"""The checks of checkpoint suites made before any job (``ihsweep.probing.suite.check_suite``,
through ``ihsweep.steps.prepare.prepare`` and a real ``snakemake -n``): a local suite without a
tokenizer and without ``vocab_size``, a context longer than the revisions' positions, revisions
of mixed architectures (local folders, and hub revisions in the Hugging Face cache); and the
planning note that a hub suite downloads its revisions, with the key that points it at local
copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from conftest import REPO, job_stats, snakemake  # noqa: E402
from ihsweep.config import ConfigError  # noqa: E402
from ihsweep.steps.prepare import prepare  # noqa: E402
from test_hf import PROBE, REVISIONS, C, V, save_revisions, tiny  # noqa: E402

B = 8


def suite_spec(root: Path, **overrides) -> dict:
    spec = {"model": str(root), "revisions": REVISIONS, "batch_size": B, "context_size": C}
    return spec | overrides


def study(**suites: dict) -> dict:
    return {"suites": suites, "probe": dict(PROBE), "execution": {"device": "cpu"}}


def config_errors(tmp_path: Path, config: dict) -> tuple[list[str], str]:
    """The `config error:` lines of a dry run of ``config``, and its whole output."""
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    result = snakemake(tmp_path, "-n")
    errors = [line for line in result.out.splitlines() if line.startswith("config error: ")]
    assert result.rc != 0 and "Job stats" not in result.out and "Traceback" not in result.out
    return errors, result.out


def save_tokenizer(folder: Path, size: int) -> None:
    """A real word-level tokenizer of ``size`` ids, as a suite's revision folder holds one."""
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)


def test_a_local_suite_without_tokenizer_or_vocab_size_is_refused_before_any_job(tmp_path):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    config = study(tiny=suite_spec(tmp_path / "suite"))
    errors, _ = config_errors(tmp_path, config)
    assert errors == [
        f"config error: suites.tiny.vocab_size: not set, and the tokenizer at revision 'step0' "
        f"({tmp_path / 'suite' / 'step0'}) has 1 token(s), fewer than the probe's 40 distinct "
        f"ones (no tokenizer files there?); set suites.tiny.vocab_size to the model's real "
        f"vocabulary"
    ]
    prepare(study(tiny=suite_spec(tmp_path / "suite", vocab_size=V)))  # the fix: passes
    with pytest.raises(ConfigError, match=r"^suites\.tiny\.vocab_size: 10 ids are fewer than"):
        prepare(study(tiny=suite_spec(tmp_path / "suite", vocab_size=10)))

    save_tokenizer(tmp_path / "suite" / "step0", V)  # a tokenizer beside the weights: passes
    prepare(study(tiny=suite_spec(tmp_path / "suite")))


def test_a_context_beyond_the_revisions_positions_is_refused_before_any_job(tmp_path):
    save_revisions(tiny("gpt2"), tmp_path / "suite")  # n_positions = C = 40
    errors, _ = config_errors(
        tmp_path, study(tiny=suite_spec(tmp_path / "suite", vocab_size=V, context_size=64))
    )
    assert errors == [
        f"config error: suites.tiny.context_size: 64 exceeds revision 'step0''s 40 positions "
        f"({tmp_path / 'suite' / 'step0' / 'config.json'}: max_position_embeddings); use "
        f"context_size <= 40, the context the suite was trained with"
    ]


@pytest.mark.parametrize(
    ("other", "differ"),
    [
        ({"n_layer": 3}, "layers 2 vs 3"),
        ({"n_embd": 64}, "width 32 vs 64"),
        ({"n_head": 2}, "heads 4 vs 2"),
    ],
)
def test_revisions_of_mixed_architectures_are_refused_before_any_job(other, differ, tmp_path):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    config = tiny("gpt2").config.to_dict() | other
    odd = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    shutil.rmtree(tmp_path / "suite" / "step2")
    odd.save_pretrained(tmp_path / "suite" / "step2")
    with pytest.raises(ConfigError) as err:
        prepare(study(tiny=suite_spec(tmp_path / "suite", vocab_size=V)))
    assert str(err.value) == (
        f"suites.tiny.revisions: 'step2' is another architecture than 'step0' ({differ}; "
        f"{tmp_path / 'suite' / 'step2' / 'config.json'}); a suite is one training run's "
        f"revisions: give the other model a suite of its own"
    )


def fill_hub_cache(cache: Path, repo: str, revisions: dict[str, dict]) -> None:
    """A Hugging Face cache holding config.json of ``repo`` at each revision (what a download
    leaves: a snapshot per commit, a ref per revision name)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    for i, (revision, config) in enumerate(revisions.items()):
        commit = f"{i:040x}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / revision).write_text(commit)
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))


def test_hub_revisions_in_the_local_cache_are_checked_and_the_rest_left_to_the_jobs(
    tmp_path, monkeypatch
):
    gpt2 = tiny("gpt2").config.to_dict()
    fill_hub_cache(
        tmp_path / "hub", "someone/tiny", {"step0": gpt2, "step1": gpt2 | {"n_layer": 3}}
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the dry run's environment
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = {"model": "someone/tiny", "revisions": REVISIONS, "batch_size": B, "context_size": C,
           "vocab_size": V}  # fmt: skip
    errors, out = config_errors(tmp_path, study(tiny=hub))
    assert len(errors) == 1 and errors[0].startswith(
        "config error: suites.tiny.revisions: 'step1' is another architecture than 'step0' "
        "(layers 2 vs 3;"
    ), out


def test_a_hub_suite_says_at_planning_that_it_downloads_and_how_to_use_local_copies(tmp_path):
    text = (REPO / "workflow" / "studies" / "pythia.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text)
    result = snakemake(tmp_path, "-n")
    assert result.rc == 0, result.out
    assert job_stats(result.out)["probe_suite"] == 7
    notes = [line for line in result.out.splitlines() if line.startswith("note: suites ")]
    assert notes == [
        "note: suites pythia-70m, pythia-160m, pythia-410m, pythia-1b, pythia-1400m, "
        "pythia-2800m, pythia-6900m download their revisions from the Hugging Face hub in the "
        "probe jobs; to use local copies, set suites.<name>.model to a folder of revision "
        "folders (<folder>/step1000/config.json), or local_files_only: true (or "
        "HF_HUB_OFFLINE=1) to read the Hugging Face cache"
    ]


def test_a_local_suite_gets_no_hub_note(tmp_path, capsys):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    prepare(study(tiny=suite_spec(tmp_path / "suite", vocab_size=V)))
    assert "Hugging Face hub" not in capsys.readouterr().err
