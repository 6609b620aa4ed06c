"""Config files read strictly: a YAML error names the file and line, a key given twice is refused.

PyYAML (and so Snakemake) keeps the last of two equal keys of a mapping without a word, so a
second ``training:`` block typed by mistake quietly replaces the first. ``read_config_file``
refuses it, naming the file and both lines, and turns every other problem of reading the file
(missing, unreadable, a syntax error, a tab, empty, not a mapping) into a ``ConfigError`` of
one line that starts with the file's name (and line, where there is one). The reading tools
(``--configfile`` of cost, status, where, ...) read their files with it, and the Snakefile
reads the files Snakemake was given a second time with it before it plans a job.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ihsweep.config.schema import ConfigError

TAB_HINT = "YAML indents with spaces: replace the tab with spaces"


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with a key given twice."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges, it is no key
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], line)
                    seen[key] = line
                except TypeError:  # an unhashable key: the constructor below says so
                    continue
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, second: int):
        super().__init__(key, first, second)
        self.key, self.first, self.second = key, first, second


def read_config_file(path: str | Path) -> dict:
    """The mapping in the YAML file ``path``; ``ConfigError`` naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; give the path of a study's YAML") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None
    try:
        config = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKey as dup:
        lines = f"lines {dup.first} and {dup.second}" if dup.first != dup.second else "one line"
        raise ConfigError(
            f"{path}:{dup.second}: key {dup.key!r} is given twice in one mapping ({lines}):"
            f" keep one of them"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(yaml_problem(path, err)) from None
    if config is None:
        raise ConfigError(f"{path}: the file is empty; a study is a YAML mapping (config.yaml)")
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path}: a study is a YAML mapping of keys to settings, not a"
            f" {type(config).__name__} (config.yaml shows one)"
        )
    return config


def yaml_problem(path: Path, err: yaml.YAMLError) -> str:
    """One line: the file, the line and column, what the parser found."""
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else f"{path}"
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    text = f"{context}, {problem}" if context else problem
    hint = f" ({TAB_HINT})" if "'\\t'" in text else ""
    return f"{where}: invalid YAML: {text}{hint}"
