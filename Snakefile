# ihsweep: when and why induction heads emerge during pretraining (see README.md).
import os
import sys

from snakemake.utils import min_version

min_version("9.0")

# The science lives in the package under workflow/; jobs import it from this checkout, so a
# rule's code is always the code beside this Snakefile, installed or not. Rules call `python`:
# the interpreter running Snakemake, unless --use-conda activates an environment.
PACKAGE_DIR = os.path.join(workflow.basedir, "workflow")
sys.path.insert(0, PACKAGE_DIR)
shell.prefix(
    "set -euo pipefail; "
    f"export PYTHONPATH={PACKAGE_DIR}" + "${{PYTHONPATH:+:$PYTHONPATH}}; "
    f"export PATH={os.path.dirname(sys.executable)}:$PATH; "
)


from ihsweep.config import ConfigError, coerce_overrides, read_config_file

# Snakemake keeps the last of two equal keys without a word: every config file is read a
# second time, strictly, so that a key given twice, or a YAML error in config.yaml, gets one
# line naming the file and line before anything is planned.
for path in workflow.config_settings.configfiles or ["config.yaml"]:
    try:
        read_config_file(path)
    except ConfigError as err:
        sys.exit(f"config error: {err}")


# A --configfile is a whole study and replaces config.yaml (several are merged in order);
# --config key=value patches whichever study is loaded.
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


# Snakemake reads a nested --config value ('training={"tokens": 80000}') as a string: each
# value from the command line is read as the type the schema wants there (config files' own
# values are not: a quoted number in a file stays an error naming its key).
try:
    coerce_overrides(config, workflow.config_settings.config)
except ConfigError as err:
    sys.exit(f"config error: {err}")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        final_outputs(),
