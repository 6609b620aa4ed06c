"""The config against its JSON schema: defaults filled in and checked in one pass, and every
problem described in one line that names the key and what would be accepted.

The schema (workflow/schemas/config.schema.yaml) is the only home of every default. One
jsonschema pass fills the defaults in, in place (so the Snakefile's ``config`` carries them
too), and checks; the message is ours rather than a dump of the schema. Steps run by hand
complete a partial section the same way (``complete``).
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
# Keys that moved to `execution`: a study file written for an older ihsweep gets told where.
MOVED_KEYS = {
    "training.device": "execution.device",
    "training.threads": "execution.threads",
    "training.progress_seconds": "execution.progress_seconds",
    "resources": "execution (gpu, gpu_model, train_mem_mb, probe_mem_mb, overhead_minutes, "
    "safety, probe_minutes)",
    "tokens_per_second": "execution.device_profile (the cost model's device constants)",
}
# Keys that a later ihsweep replaced by something else.
REPLACED_KEYS = {
    "execution.tokens_per_second": "replaced by the cost model (ihsweep.cost): set "
    "execution.device_profile to a built-in GPU profile or to the profile file that "
    "bench/gpu_plan.py writes on your GPU",
}


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, list) else [value]


class ConfigError(ValueError):
    """A problem in the study config, described in one line that names the key."""


@functools.cache
def _schema_text(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_schema(path: str | Path = SCHEMA) -> dict:
    return copy.deepcopy(_schema_text(Path(path).resolve()))


def complete(where: str, instance: dict | None = None, schema: str | Path = SCHEMA) -> dict:
    """A checked copy of one section with the schema's defaults filled in, by the same pass as
    ``prepare``: ``where`` is a top-level key (``probe``, ``emergence``, ``execution``, ...) or
    a definition (``dataset``, ``chain``). For steps run by hand with a partial spec."""
    root = load_schema(schema)
    if where in root["properties"]:
        section = root["properties"][where]
    elif where in root["$defs"]:
        section = {"$ref": f"#/$defs/{where}"}
    else:
        raise KeyError(f"{where!r} is neither a top-level key nor a definition of the schema")
    # Checked under its own name, so that every message names the key as `where.key`.
    wrapped = {where: copy.deepcopy(instance) if instance is not None else {}}
    schema_of_one = {"$defs": root["$defs"], "type": "object", "properties": {where: section}}
    problem = first_schema_problem(wrapped, schema_of_one)
    if problem:
        raise ConfigError(problem)
    return wrapped[where]


# --------------------------------------------------------------------------------------------
# Schema check and defaults in one pass; errors as one line


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    # jsonschema accepts 6.0 as an integer; the training code would then see floats.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _properties_with_defaults(validator, properties, instance, schema):
    """``properties`` that first fills in each absent key's default (a fresh copy, so no two
    entries share one object), then validates: nested defaults fill in as validation descends.
    Defaults in an ``if`` would be filled whatever the condition: the schema puts none there."""
    if validator.is_type(instance, "object"):
        for key, subschema in properties.items():
            if "default" in subschema and key not in instance:
                instance[key] = copy.deepcopy(subschema["default"])
    yield from Draft202012Validator.VALIDATORS["properties"](
        validator, properties, instance, schema
    )


_Validator = validators.extend(
    Draft202012Validator,
    validators={"properties": _properties_with_defaults},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)


def schema_validator(schema: dict) -> Any:
    """The validator that fills defaults in as it checks and takes 6.0 for no integer."""
    return _Validator(schema)


def first_schema_problem(config: dict, schema: dict) -> str | None:
    """Fill the schema's defaults into ``config`` (in place) and return the schema error that
    comes first in the config, as one line; None if there is none."""
    errors = list(_Validator(schema).iter_errors(config))
    if not errors:
        return None
    error = min(errors, key=lambda e: _position(config, e))
    return _describe(error)


def _position(config: Any, error: ValidationError) -> tuple[int, ...]:
    """Where the error sits in the config's own order, so the top-most problem is told first."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        path.append(_unknown_keys(error)[0])
    position = []
    node = config
    for key in path:
        if isinstance(node, Mapping):
            position.append(list(node).index(key))
        else:
            position.append(key)
        node = node[key]
    return tuple(position)


def key_path(path: Any) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping of keys to values",
    "null": "null",
}

_PY_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "list",
    dict: "mapping",
    type(None): "null",
}


def type_name(value: Any) -> str:
    for py_type, name in _PY_TYPE_NAMES.items():
        if type(value) is py_type:
            return name
    return "mapping" if isinstance(value, Mapping) else type(value).__name__


def _unknown_keys(error: ValidationError) -> list[str]:
    known = error.schema.get("properties", {})
    return [key for key in error.instance if key not in known]


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _describe(error: ValidationError) -> str:
    """One line: the key path, what is wrong, and what would be accepted."""
    where = key_path(error.absolute_path) or "config"
    kind, value, expected = error.validator, error.instance, error.validator_value
    if kind == "additionalProperties":
        return _describe_unknown_key(error)
    if kind == "required":
        missing = [key for key in expected if key not in value]
        return f"{where}: missing required key '{missing[0]}'"
    if kind == "type":
        return (
            f"{where}: expected {expected_types(expected)}, got {short_repr(value)} "
            f"({type_name(value)}){_number_hint(value, expected)}"
        )
    if kind in ("enum", "const"):
        allowed = ", ".join(str(a) for a in (expected if kind == "enum" else [expected]))
        return f"{where}: {short_repr(value)} is not allowed; choose one of: {allowed}"
    if kind in _BOUNDS:
        return f"{where}: must be {_BOUNDS[kind]} {expected}, got {short_repr(value)}"
    if kind == "minItems":
        return _describe_tooshort_repr(where, error)
    if kind == "maxItems":
        return f"{where}: takes at most {expected} items, got {len(value)}"
    if kind == "uniqueItems":
        return f"{where}: {short_repr(value)} repeats a value; list each value once"
    if kind == "minProperties":
        return f"{where}: must define at least {expected} entry"
    if kind == "minLength":
        return f"{where}: must not be empty"
    if kind == "pattern":
        return _describe_pattern(where, error)
    if kind == "anyOf":  # e.g. a number or `auto`: the key's description says which in words
        description = " ".join(error.schema.get("description", "").split())
        return f"{where}: {short_repr(value)} is not allowed. {description}"
    return f"{where}: {' '.join(error.message.split())}"


def _describe_tooshort_repr(where: str, error: ValidationError) -> str:
    needed, value = error.validator_value, error.instance
    if needed > 1:
        return f"{where}: needs at least {needed} items, got {len(value)}"
    if error.schema.get("type") != "array":  # a scalar would do as well (runs fields)
        return f"{where}: empty list; give a single value or a non-empty list"
    return f"{where}: empty list; give at least one item"


def _describe_unknown_key(error: ValidationError) -> str:
    where = key_path(error.absolute_path)
    key = _unknown_keys(error)[0]
    properties = error.schema.get("properties", {})
    allowed = list(properties)
    level = f"in {where}" if where else "at the top level"
    # Inside a variant (tokenizer kind, corpus source, ...) the allowed keys depend on it.
    variant = [f"{k}: {s['const']}" for k, s in properties.items() if "const" in s]
    if variant:
        level += f" with {variant[0]}"
    path = key_path([*error.absolute_path, key])
    if path in REPLACED_KEYS:
        return f"{path}: {REPLACED_KEYS[path]}"
    moved = MOVED_KEYS.get(path) or MOVED_KEYS.get(str(key))
    if moved:
        return f"{path}: moved to {moved}; where a study runs is not part of what it studies"
    line = f"{path}: unknown key {level}; allowed keys: "
    line += ", ".join(allowed)
    guess = difflib.get_close_matches(str(key), allowed, n=1)
    if guess:
        line += f" (did you mean '{guess[0]}'?)"
    if where == "checkpoints":
        # Easy to hit when merging several --configfile files, key by key.
        line += "; checkpoints take either {start, linear_from, every} or {tokens: [...]}, not both"
    return line


def _describe_pattern(where: str, error: ValidationError) -> str:
    # The pattern itself is unreadable for most users; the key's description says it in words.
    description = " ".join(error.schema.get("description", "").split())
    if "propertyNames" in error.relative_schema_path:
        return f"{where}: name {short_repr(error.instance)} is not allowed. {description}"
    return f"{where}: {short_repr(error.instance)} is not allowed. {description}"


def expected_types(expected: str | list[str]) -> str:
    names = [_TYPE_NAMES.get(t, t) for t in as_list(expected)]
    return " or ".join(names)


def _number_hint(value: Any, expected: str | list[str]) -> str:
    """How to write a number that was given as text or as the wrong kind of number."""
    if isinstance(value, bool) or not isinstance(value, str | float):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if "integer" in as_list(expected) and number.is_integer():
        # Quoted in a file, the digits are right and the quotes wrong: say so, not the digits.
        quoted = isinstance(value, str) and value.strip() == str(int(number))
        return f"; write {int(number)} without quotes" if quoted else f"; write {int(number)}"
    if isinstance(value, str) and "number" in as_list(expected):
        return f"; YAML took it as text, write {_yaml_float(number)} (no quotes)"
    return ""


def _yaml_float(number: float) -> str:
    """``number`` as PyYAML (YAML 1.1) reads a float: with a dot, and a sign on the exponent."""
    text = repr(number)
    if "e" not in text:
        return text
    mantissa, exponent = f"{number:e}".split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"
