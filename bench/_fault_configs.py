"""The fault matrix's configs class: malformed config files through every way a study is read.

Each case is the repository's config.yaml damaged one way: YAML syntax (a tab, an unclosed
bracket or quote, a misplaced colon, an unknown alias, two documents), a key given twice at
several depths, a file that is empty, only comments, a list, a scalar, not UTF-8 or missing,
and settings of the wrong type, out of range or unknown. Each goes through ``python -m
ihsweep.cost --configfile <file>`` and ``snakemake -n --configfile <file>``; a case passes
when each exits non-zero without a traceback and without planning a job, with one line that
names the file and its line (a file's problem) or the key (a setting's problem).

Snakemake reads a ``--configfile`` before the Snakefile runs: a file that is no YAML at all, or
missing, fails there with Snakemake's own message, which names no file for a YAML error.
Those cases pass through Snakemake when it prints the message that docs/configuration.md quotes
with its fix (``SNAKEMAKE_OWN``); ``python -m ihsweep.cost --configfile <file>`` then names the
line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from _common import package_env

REPO = Path(__file__).resolve().parents[1]
BASE = (REPO / "config.yaml").read_text()
# Snakemake's messages for a --configfile it cannot read, as docs/configuration.md quotes them.
SNAKEMAKE_OWN = {
    "yaml": "Config file is not valid JSON or YAML. In case of YAML, make sure to not mix "
    "whitespace and tab indentation.",
    "mapping": "Config file must be given as JSON or YAML with keys at top level.",
    "utf-8": "UnicodeDecodeError: 'utf-8' codec can't decode byte",
    "missing": "FileNotFoundError: [Errno 2] No such file or directory:",
}
FILE_LINE = r"{file}:\d+"  # the file and a line


@dataclass(frozen=True)
class ConfigCase:
    name: str
    text: str | bytes | None  # None: the file does not exist
    expect: tuple[str, ...]  # regexes the one line must match ({file}: the file's path)
    snakemake_own: str | None = None  # a key of SNAKEMAKE_OWN: Snakemake fails first


def replaced(old: str, new: str, count: int = 1) -> str:
    if old not in BASE:
        raise ValueError(f"config.yaml has no {old!r}: update bench/_fault_configs.py")
    return BASE.replace(old, new, count)


def overridden(override: str) -> str:
    """config.yaml with ``override`` (YAML) merged in, as Snakemake merges config files."""
    from snakemake.utils import update_config

    config = yaml.safe_load(BASE)
    update_config(config, yaml.safe_load(override))
    return yaml.safe_dump(config, sort_keys=False)


def syntax(name: str, text: str) -> ConfigCase:
    return ConfigCase(name, text, (FILE_LINE, "invalid YAML"), "yaml")


def duplicate(name: str, text: str, key: str) -> ConfigCase:
    return ConfigCase(name, text, (FILE_LINE, f"key '{key}' is given twice"))


def setting(name: str, override: str, *expect: str) -> ConfigCase:
    return ConfigCase(name, overridden(override), expect)


CASES = [
    syntax("tab-indent", replaced("  lr: 0.006", "\tlr: 0.006")),
    syntax("tab-after-a-key", replaced("  lr: 0.006", "  lr:\t\n\t0.006")),
    syntax("unclosed-bracket", replaced("betas: [0.9, 0.999]", "betas: [0.9, 0.999")),
    syntax("unclosed-brace", replaced("corpus: {source: kjv}", "corpus: {source: kjv")),
    syntax("unclosed-quote", replaced("study: default", 'study: "default')),
    syntax("colon-in-a-value", replaced("  lr: 0.006", "  lr: 0.006: 2")),
    syntax("indented-too-far", replaced("  warmup_fraction: 0.01", "    warmup_fraction: 0.01")),
    syntax("dedented-in-a-block", replaced("  seed: 1234", " seed: 1234")),
    syntax("unknown-alias", replaced("    <<: *syn", "    <<: *sin")),
    syntax("dash-in-a-mapping", replaced("  eps: 1.0e-8", "  - eps: 1.0e-8")),
    syntax("two-documents", BASE + "---\nstudy: other\n"),
    syntax("stray-brace", replaced("  min_layer: 1", "  min_layer: 1\n}")),
    duplicate("duplicate-top-level", BASE + "study: other\n", "study"),
    duplicate("duplicate-section", BASE + "training: {lr: 0.1}\n", "training"),
    duplicate(
        "duplicate-nested", replaced("training:\n", "training:\n  tokens: 1000000\n"), "tokens"
    ),  # fmt: skip
    duplicate(
        "duplicate-in-a-flow-mapping",
        replaced(
            "n_layer: 2, n_head: 4, d_model: 32", "n_layer: 2, n_layer: 3, n_head: 4, d_model: 32"
        ),
        "n_layer",
    ),  # fmt: skip
    duplicate(
        "duplicate-in-a-runs-entry",
        replaced("{data: semi, model: w64,", "{data: semi, model: w64, model: w48,"),
        "model",
    ),  # fmt: skip
    duplicate(
        "duplicate-four-deep",
        replaced("      copy_fraction: 1.0", "      copy_fraction: 1.0\n      copy_fraction: 0.5"),
        "copy_fraction",
    ),  # fmt: skip
    duplicate(
        "duplicate-model",
        replaced(
            "  w48: {",
            "  w32: {n_layer: 1, n_head: 4, d_model: 32, mlp: false, n_ctx: 64}\n  w48: {",
        ),
        "w32",
    ),  # fmt: skip
    ConfigCase("empty-file", "", ("{file}: the file is empty",), "mapping"),
    ConfigCase(
        "only-comments", "# a study\n# nothing yet\n", ("{file}: the file is empty",), "mapping"
    ),  # fmt: skip
    ConfigCase(
        "a-list", "- study: default\n", ("{file}: a study is a YAML mapping", "list"), "mapping"
    ),  # fmt: skip
    ConfigCase("a-scalar", "default\n", ("{file}: a study is a YAML mapping", "str"), "mapping"),
    ConfigCase(
        "not-utf-8", BASE.encode() + b"\xff\xfe\n", ("{file}: cannot be read",), "utf-8"
    ),  # fmt: skip
    ConfigCase("missing-file", None, ("{file}: no such file",), "missing"),
    setting("wrong-type-number", "training: {lr: fast}", "training.lr", "expected a number"),
    setting("wrong-type-list", "training: {betas: 0.9}", "training.betas"),
    setting("wrong-type-section", "probe: 5", "probe"),
    setting("wrong-type-bool", "models: {w32: {mlp: maybe}}", "models.w32.mlp"),
    setting("negative-lr", "training: {lr: -0.1}", "training.lr"),
    setting("zero-budget", "training: {tokens: 0}", "training.tokens"),
    setting("warmup-above-one", "training: {warmup_fraction: 2}", "training.warmup_fraction"),
    setting("zero-layers", "models: {w32: {n_layer: 0}}", "models.w32.n_layer"),
    setting("zero-probe-sequences", "probe: {n_sequences: 0}", "probe.n_sequences"),
    setting("unknown-metric", "emergence: {metric: ps_mean}", "emergence.metric"),
    setting("unknown-top-level-key", "trainig: {lr: 0.1}", "trainig", "did you mean"),
    setting("unknown-nested-key", "training: {tokenz: 100}", "training.tokenz"),
    setting("unknown-execution-key", "execution: {gpus: 2}", "execution.gpus"),
    setting("bad-device", "execution: {device: tpu}", "execution.device"),
    setting("zero-threads", "execution: {threads: 0}", "execution.threads"),
    setting("bad-micro-batch", "execution: {micro_batch: some}", "execution.micro_batch"),
    setting("zero-vocab-padding", "execution: {vocab_padding: 0}", "execution.vocab_padding"),
    setting("compile-yes", "execution: {compile: 'yes'}", "execution.compile"),
    setting(
        "budget-below-the-first-checkpoint",
        "training: {tokens: 2000}",
        "training.tokens",
        "before the first checkpoint",
    ),  # fmt: skip
    setting("d_model-not-divisible", "models: {w32: {d_model: 34}}", "models.w32.d_model"),
    setting("bad-study-name", "study: 'my study'", "study"),
]


def run(argv: list[str], workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=workdir, env=package_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def through_cost(path: Path, workdir: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "ihsweep.cost", "--configfile", str(path)], workdir)


def through_snakemake(path: Path, workdir: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "-s",
                str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(path)],
               workdir)  # fmt: skip


def problem(case: ConfigCase, path: Path, proc: subprocess.CompletedProcess, own: bool) -> str:
    """'' if ``proc`` failed as the case says; else what it did."""
    out = proc.stdout + proc.stderr
    if proc.returncode == 0 or "Job stats" in out:
        return f"rc {proc.returncode}: {out[-400:]!r}"
    if own:  # before the Snakefile runs: Snakemake's message, sometimes after its traceback
        return "" if SNAKEMAKE_OWN[case.snakemake_own] in out else f"{out[-400:]!r}"
    if "Traceback" in out:
        return f"a traceback: {out[-400:]!r}"
    lines = [line for line in out.splitlines() if line.startswith("config error: ")]
    if len(lines) != 1:
        return f"{len(lines)} config error lines: {out[-400:]!r}"
    file = re.escape(str(path))
    missing = [e for e in case.expect if not re.search(e.replace("{file}", file), lines[0])]
    return f"{lines[0]!r} lacks {missing}" if missing else ""


def try_case(case: ConfigCase, folder: Path) -> tuple[str, bool, str]:
    path = folder / f"{case.name}.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    elif case.text is not None:
        path.write_text(case.text)
    workdir = folder / f"{case.name}-work"
    workdir.mkdir()
    found = []
    for entry, proc in (("cost", through_cost(path, workdir)),
                        ("snakemake", through_snakemake(path, workdir))):  # fmt: skip
        own = entry == "snakemake" and case.snakemake_own is not None
        if why := problem(case, path, proc, own):
            found.append(f"{entry}: {why}")
    if (workdir / "results").exists():
        found.append("a results/ folder was made")
    return case.name, not found, "; ".join(found) or "one line, as said"


def config_cases(quick: bool) -> list[tuple[str, bool, str]]:
    cases = CASES[::6] if quick else CASES
    with tempfile.TemporaryDirectory(prefix="ihsweep-configs-") as tmp:
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
            return list(pool.map(lambda case: try_case(case, Path(tmp)), cases))
