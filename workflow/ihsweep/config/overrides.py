"""``--config`` overrides read as the schema says: ``training={"tokens": 80000}`` is 80000.

Snakemake parses a top-level ``--config key=value`` as a number or a boolean where it can, but
a nested value (``--config 'training={"tokens": 80000}'``) with YAML's base loader, which
leaves every scalar a string, and the schema then refuses ``'80000'``. ``coerce_overrides``
reads each string that came from the command line as YAML reads it in a file (``80000`` an
integer, ``null`` None) where the schema accepts that value there, and a string the schema
still refuses as the first of the key's types it parses as: an integer, a number (``1e-3``
included, which YAML 1.1 leaves a string), a boolean, null, a list or a mapping (a nested one
is then coerced in turn). Only values from
the command line are touched: a quoted ``tokens: "80000"`` in a YAML file stays refused,
naming the file's key, as before. A command-line value that parses as none of its types is
refused here with one line that names the key, the value, the type and the ``--config`` form.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import ValidationError

from ihsweep.config.schema import (
    SCHEMA,
    ConfigError,
    as_list,
    expected_types,
    key_path,
    load_schema,
    schema_validator,
)

# Each pass coerces the values the schema refused; a coerced mapping or list, or an if/then
# branch the coercion selects, can show more of them in the next pass.
MAX_PASSES = 8
_EXAMPLES = {"integer": 1000, "number": 0.001, "boolean": True, "null": None, "string": "text"}


class _Unparsed(Exception):
    """The text is none of the types it was tried as."""


def parse_overrides(entries: Iterable[str]) -> dict:
    """``--config`` entries (``key=value``) parsed exactly as Snakemake parses them."""
    from snakemake.cli import parse_config

    try:
        return parse_config(list(entries))
    except ValueError as err:
        raise ConfigError(f"--config: {err}; write key=value or 'key={{\"sub\": value}}'") from None


def coerce_overrides(config: dict, overrides: Mapping, schema: str | Path = SCHEMA) -> dict:
    """Coerce, in place, the strings of ``config`` that came from ``overrides`` (Snakemake's
    parsed ``--config``, already merged into ``config``) to the types the schema wants there;
    returns ``config``. Raises ``ConfigError`` for a value that parses as none of them."""
    validator = schema_validator(load_schema(schema))
    for path, text in _strings(overrides):
        _read_as_yaml(config, path, text, validator)
    for _ in range(MAX_PASSES):
        # Validated on a copy: validation fills the schema's defaults in, which is prepare's job.
        refused = list(_refused_strings(validator.iter_errors(copy.deepcopy(config)), overrides))
        if not refused:
            break
        changed = False
        for path, types, error in refused:
            text = _get(config, path)
            value = _coerce(text, types, path, error)
            changed |= value is not text
            _set(config, path, value)
        if not changed:  # what is left is prepare's to describe
            break
    return config


def _strings(node: Any, path: tuple = ()) -> Iterator[tuple[list, str]]:
    """``(path, text)`` of every string in nested mappings and lists."""
    if isinstance(node, str):
        yield list(path), node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, (*path, index))


def _read_as_yaml(config: dict, path: list, text: str, validator: Any) -> None:
    """Set the value at ``path`` to ``text`` read as YAML (``null`` is None, ``80000`` an
    integer), as a config file would give it, where the schema accepts that there: a key that
    takes a string or null gets None from ``null``, as from a file."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    if isinstance(value, str) or _get(config, path) != text:
        return
    trial = copy.deepcopy(config)
    _set(trial, path, value)
    for error in validator.iter_errors(trial):
        if list(error.absolute_path)[: len(path)] == path:
            return
    _set(config, path, value)


def _refused_strings(
    errors: Iterable[ValidationError], overrides: Mapping
) -> Iterator[tuple[list, list[str], ValidationError]]:
    """``(path, types the schema accepts there, error)`` for each command-line string that the
    schema refused for its type, once per path."""
    seen = set()
    for error in errors:
        path = list(error.absolute_path)
        if key_path(path) in seen or not isinstance(_get(overrides, path), str):
            continue
        types = _accepted_types(error)
        if types:
            seen.add(key_path(path))
            yield path, types, error


def _accepted_types(error: ValidationError) -> list[str]:
    """The types that a ``type`` error, or each ``type`` branch of an ``anyOf``, accepts."""
    if error.validator == "type":
        return as_list(error.validator_value)
    if error.validator != "anyOf":
        return []
    branches = sorted(error.context or [], key=lambda e: list(e.relative_schema_path))
    types = []
    for branch in branches:
        same_place = list(branch.absolute_path) == list(error.absolute_path)
        if branch.validator == "type" and same_place:
            types += [t for t in as_list(branch.validator_value) if t not in types]
    return types


def _coerce(text: str, types: list[str], path: list, error: ValidationError) -> Any:
    for kind in types:
        try:
            return _parse(text, kind)
        except _Unparsed:
            continue
    if error.validator == "anyOf":  # a keyword (auto, pythia) might be meant: prepare says which
        return text
    raise ConfigError(_unparsed_message(text, types, path, error))


def _parse(text: str, kind: str) -> Any:
    """``text`` as a value of the JSON type ``kind``, read as YAML reads it; numbers also as
    Python's ``float`` reads them (PyYAML's YAML 1.1 takes ``1e-3`` for a string)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if kind == "number" and not _is_number(value):
        try:
            value = float(text)
        except ValueError:
            raise _Unparsed from None
    if not _is_type(value, kind):
        raise _Unparsed
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_type(value: Any, kind: str) -> bool:
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": _is_number,
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return kind in checks and checks[kind](value)


def _unparsed_message(text: str, types: list[str], path: list, error: ValidationError) -> str:
    """One line: the key, the value, the type wanted, and the --config form that gives it."""
    where = key_path(path)
    example = _example(text, types, error.schema.get("default"))
    form = _config_form(path, example)
    how = f"e.g. --config {form}" if form else f"e.g. {json.dumps(example)}"
    return (
        f"{where}: --config gave {text!r}, which is not {expected_types(types)}; "
        f"give {expected_types(types)} without quotes, {how}"
    )


def _example(text: str, types: list[str], default: Any) -> Any:
    """A value of the wanted type: the one meant, where it shows (``1e5`` for an integer is
    100000), else the key's default, else a typical value."""
    kind = types[0]
    try:
        number = float(text)
    except ValueError:
        number = None
    if kind == "integer" and number is not None and number.is_integer():
        return int(number)
    if default is not None and _is_type(default, kind):
        return default
    return _EXAMPLES.get(kind, [] if kind == "array" else {})


def _config_form(path: list, value: Any) -> str | None:
    """``--config``'s argument that sets the key at ``path`` to ``value``, quoted for a shell;
    None where the path runs through a list (the whole list is given then)."""
    if any(isinstance(key, int) for key in path):
        return None
    nested = value
    for key in reversed(path[1:]):
        nested = {key: nested}
    text = json.dumps(nested) if len(path) > 1 else yaml.safe_dump(value).split("\n")[0]
    return f"'{path[0]}={text}'" if len(path) > 1 else f"{path[0]}={text}"


def _get(node: Any, path: list) -> Any:
    """The value at ``path`` in nested mappings and lists; None where there is none."""
    for key in path:
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return None
    return node


def _set(node: Any, path: list, value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
