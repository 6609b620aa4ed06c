"""The execution settings, declared once: the schema's ``execution`` section.

Each setting of workflow/schemas/config.schema.yaml's ``execution`` that names rules in
``x-rules`` reaches those rules' jobs on one path, with no list of settings anywhere else:

- the rule: a Snakemake resource of its name (``x-resource`` where Snakemake has a name of its
  own, ``mem_mb``), or the rule's ``threads`` for ``threads`` (``rule_resources``), so that
  ``--set-resources`` / ``--set-threads`` override it per rule and changing it plans no job;
- the step's command line: a flag ``--<key with dashes>`` that the rule fills in from the
  resource (``rule_flags``) and the step declares from the same schema (``add_flags``);
- the job: ``Execution``, one frozen object with one typed field per setting (a flag left out
  takes the schema's default).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

import yaml

from ihsweep.config.schema import ConfigError, complete, load_schema
from ihsweep.config.study import EXECUTION

THREADS = "threads"  # the setting that is a rule's threads, not a resource
_PYTHON_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str}
_PYTHON_TYPES["null"] = type(None)


def _settings() -> dict[str, dict]:
    """The schema of each execution setting, in the schema's order."""
    return load_schema()["properties"][EXECUTION]["properties"]


def _python_type(schema: dict) -> Any:
    """The annotation of a setting: the union of the JSON types its schema accepts."""
    types: list = []
    for branch in schema.get("anyOf", [schema]):
        if "const" in branch:
            types.append(type(branch["const"]))
        kinds = branch.get("type", [])
        types += [_PYTHON_TYPES[kind] for kind in ([kinds] if isinstance(kinds, str) else kinds)]
    annotation = None
    for kind in dict.fromkeys(types):  # in order, once each
        annotation = kind if annotation is None else annotation | kind
    return annotation


def _execution_class() -> type:
    fields = [
        (key, _python_type(schema), dataclasses.field(default=schema.get("default")))
        for key, schema in _settings().items()
    ]
    doc = "One job's execution settings, a field per key of the schema's ``execution``."
    cls = dataclasses.make_dataclass("Execution", fields, frozen=True, namespace={"__doc__": doc})
    cls.__module__ = __name__
    return cls


Execution = _execution_class()


def execution_of(section: dict | None = None) -> Execution:
    """The ``Execution`` of a (partial) ``execution`` section: checked, defaults filled in."""
    return Execution(**complete(EXECUTION, section))


# --------------------------------------------------------------------------------------------
# The rules' resources and the steps' flags


@dataclasses.dataclass(frozen=True)
class RuleSetting:
    """How one execution setting reaches a rule's job."""

    key: str  # of `execution`
    resource: str  # the rule's resource (``threads``: the rule's threads)
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def placeholder(self) -> str:
        """What the rule's shell command gives the flag: its resource, shell-quoted."""
        return "{threads}" if self.key == THREADS else f"{{resources.{self.resource}:q}}"


@functools.cache
def rule_settings(rule: str) -> tuple[RuleSetting, ...]:
    """The execution settings that ``rule``'s jobs take (the schema's ``x-rules``)."""
    return tuple(
        RuleSetting(key, schema.get("x-resource", key), _first_sentence(schema["description"]))
        for key, schema in _settings().items()
        if rule in schema.get("x-rules", [])
    )


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".").replace("%", "%%")  # argparse formats help with %


def rule_resources(execution: dict, rule: str, **per_job: Any) -> dict[str, Any]:
    """``rule``'s Snakemake resources from a completed ``execution`` section (threads aside):
    numbers and strings as they are, booleans as true/false, null as an empty string.
    ``per_job``: resources the rule computes per job (functions of its wildcards, as a
    setting's ``auto`` that each job resolves), in place of the setting's value."""
    resources = {
        setting.resource: _resource_value(execution[setting.key])
        for setting in rule_settings(rule)
        if setting.key != THREADS
    }
    return {**resources, **per_job}


def _resource_value(value: Any) -> int | str:
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else value


def rule_flags(rule: str) -> str:
    """The part of ``rule``'s shell command that hands its execution settings to its step."""
    return " ".join(f"{s.flag}={s.placeholder}" for s in rule_settings(rule))  # = : "" is a value


def add_flags(p: argparse.ArgumentParser, rule: str) -> None:
    """The step's flags of the execution settings ``rule`` takes; a flag left out takes the
    schema's default (``flags_execution``)."""
    for setting in rule_settings(rule):
        p.add_argument(
            setting.flag,
            dest=setting.key,
            type=functools.partial(setting_value, setting.key),
            help=f"execution.{setting.key}: {setting.help}",
        )


def flags_execution(args: argparse.Namespace, rule: str) -> Execution:
    """The ``Execution`` of a step's parsed flags (``add_flags``)."""
    given = {
        s.key: getattr(args, s.key)
        for s in rule_settings(rule)
        if getattr(args, s.key, None) is not None
    }
    return execution_of(given)


def setting_value(key: str, text: str) -> Any:
    """A flag's text as the value the schema accepts for ``key``, read as YAML reads it in a
    config file (``16000`` a number, ``true`` a boolean, an empty string null); the text itself
    where the schema accepts no such value (``auto``, a path)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        return value
    try:
        complete(EXECUTION, {key: value})
    except ConfigError:
        return text
    return value
