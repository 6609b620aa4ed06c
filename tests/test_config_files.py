"""Config files read strictly (``ihsweep.config.files``): every malformed file of the fault
matrix's configs class (``bench/_fault_configs.py``) ends, through ``python -m ihsweep.cost``
and through a Snakemake dry run, in one line naming the file and line or the key; the
configuration page the README links (docs/configuration.md) quotes the messages Snakemake prints
itself, before the Snakefile runs; and the strict reading reads every shipped study as PyYAML
does."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import REPO
from ihsweep.config import ConfigError, read_config_file

sys.path.insert(0, str(REPO / "bench"))
from _fault_configs import CASES, SNAKEMAKE_OWN, config_cases  # noqa: E402


@pytest.mark.slow
def test_every_malformed_config_file_is_one_line_through_cost_and_snakemake():
    results = config_cases(quick=False)
    assert len(results) == len(CASES) >= 40
    failed = [(name, detail) for name, passed, detail in results if not passed]
    assert not failed, failed


def test_the_readme_links_the_page_that_quotes_what_snakemake_says_itself_and_the_fix():
    assert "(docs/configuration.md" in (REPO / "README.md").read_text()
    page = (REPO / "docs" / "configuration.md").read_text()
    for message in SNAKEMAKE_OWN.values():
        assert message in page, message


def test_shipped_studies_read_strictly_as_pyyaml_reads_them():
    studies = [REPO / "config.yaml", *REPO.glob("workflow/studies/*.yaml"),
               *REPO.glob("tests/studies/*.yaml")]  # fmt: skip
    assert len(studies) > 5
    for path in studies:
        assert read_config_file(path) == yaml.safe_load(path.read_text()), path


def test_a_merge_key_is_no_duplicate_but_a_key_twice_in_a_merged_mapping_is(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("a: &x {k: 1, m: 2}\nb:\n  <<: *x\n  k: 3\n")
    assert read_config_file(path)["b"] == {"k": 3, "m": 2}
    path.write_text("a: &x {k: 1}\nb:\n  <<: *x\n  k: 3\n  k: 4\n")
    twice = r"study.yaml:5: key 'k' is given twice in one mapping .lines 4 and 5"
    with pytest.raises(ConfigError, match=twice):
        read_config_file(path)
