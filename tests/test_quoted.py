"""Each measured figure is stated once, in docs/measurements.md's table; the pages quote it
(docs/quoted.py). The quotes are regenerated from the table and compared; the one figure the
code can compute (paper-full's cost against paper.yaml's) is computed again."""

import importlib.util

import pytest
from conftest import REPO
from ihsweep.config import study_of_files
from ihsweep.cost.report import cost_table
from ihsweep.cost.study import StudyCost

spec = importlib.util.spec_from_file_location("quoted", REPO / "docs" / "quoted.py")
quoted = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quoted)


def test_every_quoted_figure_is_the_tables():
    table = quoted.figures()
    for path in quoted.quoting_files():
        text = path.read_text()
        where = path.relative_to(REPO)
        assert quoted.requote(text, table, str(where)) == text, quoted.differences(table)


def test_every_figure_of_the_table_is_quoted_and_those_the_issue_found_twice_are():
    """A figure the pages quote once or more; the ones two pages stated differently (install
    time, the quick fault matrix, the test suite, paper-full's cost) are quotes now."""
    table = quoted.figures()
    names = {
        name
        for path in quoted.quoting_files()
        for name, _ in quoted.QUOTE.findall(path.read_text())
    }
    assert names == set(table)
    assert {"install-amd", "quick-faults", "test-amd", "paper-full-cost"} <= names


def test_a_quote_that_differs_is_named_and_rewritten(tmp_path):
    table = {"install-amd": "68 s"}
    text = "install: <!--fig:install-amd-->59 s<!--/fig-->, then"
    assert (
        quoted.requote(text, table, "page")
        == "install: <!--fig:install-amd-->68 s<!--/fig-->, then"
    )
    with pytest.raises(ValueError, match="quotes figure 'gone', which measurements.md lacks"):
        quoted.requote("<!--fig:gone-->1<!--/fig-->", table, "page")
    twice = tmp_path / "measurements.md"
    twice.write_text(f"{quoted.HEADING}\n\n| `a` | 1 | x |\n| `a` | 2 | y |\n")
    with pytest.raises(ValueError, match="figure 'a' is named twice"):
        quoted.figures(twice)


def test_paper_fulls_cost_is_what_the_cost_tool_prints():
    """paper-full (every run to its budget) in GPU-hours over paper.yaml's with early stop."""
    studies = REPO / "workflow" / "studies"
    paper = cost_table(StudyCost(study_of_files([studies / "paper.yaml"])))
    full = cost_table(
        StudyCost(study_of_files([studies / "paper.yaml", studies / "paper-full.yaml"]))
    )
    ratio = full.early_stop_device_hours.sum() / paper.early_stop_device_hours.sum()
    assert f"{ratio:.1f}x" == quoted.figures()["paper-full-cost"]
