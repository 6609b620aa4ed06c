"""The study configuration: what a study computes, read and checked before any job exists.

- ``ihsweep.config.schema``: the JSON schema (workflow/schemas/config.schema.yaml, the only
  home of every default) filled in and checked in one pass; ``ConfigError`` messages of one
  line that name the key and what would be accepted; ``complete`` for a step's partial section.
- ``ihsweep.config.study``: the study model: ``Run``, ``Study`` (grid, checkpoint schedule, the
  law's predictions, each run's training spec).
- ``ihsweep.config.execution``: the execution settings declared once (the schema's
  ``execution``): ``Execution``, the rules' resources and the steps' flags.
- ``ihsweep.config.keys``: where a study's files are: ``StudyPaths``, each folder keyed by the
  settings that decide its files.
- ``ihsweep.config.files``: config files read strictly (``read_config_file``): a YAML error
  names the file and line, a key given twice is refused.
- ``ihsweep.config.overrides``: ``--config`` values read as the schema's types
  (``training={"tokens": 80000}`` arrives from Snakemake as a string).
- ``ihsweep.config.checks``: the checks a schema cannot express that need nothing but the
  config, ``read_study`` (schema, checks, ``Study``) and the command-line tools' config files.

This package imports nothing of ihsweep's but ``layout``: the checks that need the data,
probing and cost layers are ``ihsweep.steps.prepare``'s, whose ``prepare`` the Snakefile calls.
"""

from ihsweep.config.checks import (
    add_configfile,
    load_configfiles,
    read_study,
    reports_config_errors,
    study_of_files,
)
from ihsweep.config.execution import Execution, execution_of
from ihsweep.config.files import read_config_file
from ihsweep.config.keys import StudyPaths, probe_key
from ihsweep.config.overrides import coerce_overrides, parse_overrides
from ihsweep.config.schema import (
    MOVED_KEYS,
    SCHEMA,
    ConfigError,
    complete,
    first_schema_problem,
    load_schema,
)
from ihsweep.config.study import (
    EXECUTION,
    GPT2_VOCAB_SIZE,
    MODEL_KEYS,
    Run,
    Study,
    checkpoint_steps,
    densify_tokens,
    expand_runs,
    law_updates,
    schedule_tokens,
    study_definition,
)

__all__ = [
    "EXECUTION", "GPT2_VOCAB_SIZE", "MODEL_KEYS", "MOVED_KEYS", "SCHEMA", "ConfigError",
    "Execution", "Run", "Study", "StudyPaths", "add_configfile", "checkpoint_steps",
    "coerce_overrides", "complete", "densify_tokens", "execution_of", "parse_overrides",
    "expand_runs", "first_schema_problem", "law_updates", "load_configfiles", "load_schema",
    "probe_key", "read_config_file", "read_study", "schedule_tokens", "study_definition",
    "reports_config_errors",
    "study_of_files",
]  # fmt: skip
