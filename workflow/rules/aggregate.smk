# Aggregates: emergence point per run, the law fit across runs (natural data), the (f, r)
# frontier and the property grid (Markov data), and their figures. Cheap: they run beside the
# driver even when the other jobs go to a cluster. Each also writes its experiments' findings
# (findings.rst, from the tables it just wrote), which the report's front page includes.

EXPERIMENT_1 = "1. When: batch size, context size, model size"
EXPERIMENTS_2_3 = "2-3. Why: Markov data statistics"


localrules:
    figures,
    aggregate_natural,
    heldout_natural,
    aggregate_markov,
    run_figure,


rule aggregate_natural:
    input:
        tables=natural_model_tables(),
        duplicates=suite_duplicates(),
        records=run_records("natural"),
        run_figure=front_page_run_figure("natural"),
    output:
        tables=[
            layout.aggregate_file(name, NATURAL_DIR)
            for name in layout.NATURAL_TABLES
            if not name.endswith(".html")
        ],
        emergence_html=report_table(
            layout.aggregate_file("emergence.html", NATURAL_DIR),
            "../report/natural_emergence.rst",
            EXPERIMENT_1,
            "emergence per run",
        ),
        fit_html=report_table(
            layout.aggregate_file("lawfit.html", NATURAL_DIR),
            "../report/lawfit.rst",
            EXPERIMENT_1,
            "law fit",
        ),
        figures=report_figures(
            layout.NATURAL_FIGURES,
            NATURAL_DIR,
            EXPERIMENT_1,
            caption_of=lambda stem: stem,
            label_of=lambda stem: stem.replace("_", " "),
        ),
        pdfs=layout.figure_files(layout.NATURAL_FIGURES, NATURAL_DIR)[1::2],
        provenance=layout.aggregate_file(layout.PROVENANCE, NATURAL_DIR),
        findings=layout.aggregate_file(layout.FINDINGS, NATURAL_DIR),
    log:
        layout.log("aggregate", f"{STUDY.name}/natural"),
    conda:
        "../../envs/analysis.yaml"
    params:
        emergence=section_json("emergence"),
        lawfit=section_json("lawfit"),
        families=model_families(),
        keep_duplicates=kept_duplicates(),
        out_dir=provenance_dir,
        config_sha256=CONFIG_SHA256,
        # Not in the command (the step hashes the code it runs): a trigger for Snakemake.
        code_sha256=CODE_SHA256,
    shell:
        "python -m ihsweep.steps.aggregate_natural --model-tables {input.tables}"
        " --run-records {input.records} --run-figure {input.run_figure}"
        " --suite-duplicates {input.duplicates} --keep-duplicates {params.keep_duplicates:q}"
        " --emergence {params.emergence:q} --lawfit {params.lawfit:q}"
        " --families {params.families:q}"
        " --out-dir {params.out_dir} --config-sha256 {params.config_sha256} > {log} 2>&1"


# How the law predicts runs it never saw: each (B, C) cell left out in turn, and the largest
# third by B * C, predicted by the study's fit, the published exponents calibrated on the study,
# and the published law (docs/method.md#held-out-validation).
HELDOUT_DIR = layout.heldout_dir(NATURAL_DIR)


rule heldout_natural:
    input:
        emergence=layout.aggregate_file("emergence.csv", NATURAL_DIR),
    output:
        tables=[
            layout.aggregate_file(name, HELDOUT_DIR)
            for name in layout.HELDOUT_TABLES
            if not name.endswith(".html")
        ],
        html=report_table(
            layout.aggregate_file("heldout.html", HELDOUT_DIR),
            "../report/heldout.rst",
            EXPERIMENT_1,
            "law on held-out runs",
        ),
        figures=report_figures(
            layout.HELDOUT_FIGURES,
            HELDOUT_DIR,
            EXPERIMENT_1,
            caption_of=lambda stem: stem,
            label_of=lambda stem: "law on held-out runs",
        ),
        pdfs=layout.figure_files(layout.HELDOUT_FIGURES, HELDOUT_DIR)[1::2],
        provenance=layout.aggregate_file(layout.PROVENANCE, HELDOUT_DIR),
    log:
        layout.log("heldout", f"{STUDY.name}/natural"),
    conda:
        "../../envs/analysis.yaml"
    params:
        lawfit=section_json("lawfit"),
        study=STUDY.name,
        out_dir=provenance_dir,
        config_sha256=CONFIG_SHA256,
        # Not in the command (the step hashes the code it runs): a trigger for Snakemake.
        code_sha256=CODE_SHA256,
    shell:
        "python -m ihsweep.steps.heldout_natural --emergence-table {input.emergence}"
        " --lawfit {params.lawfit:q} --study {params.study} --out-dir {params.out_dir}"
        " --config-sha256 {params.config_sha256} > {log} 2>&1"


rule aggregate_markov:
    input:
        tables=markov_model_tables(),
        chunks=markov_chunk_metas(),
        records=run_records("markov"),
        run_figure=front_page_run_figure("markov"),
    output:
        tables=[
            layout.aggregate_file(name, MARKOV_DIR)
            for name in layout.MARKOV_TABLES
            if not name.endswith(".html")
        ],
        emergence_html=report_table(
            layout.aggregate_file("emergence.html", MARKOV_DIR),
            "../report/markov_emergence.rst",
            EXPERIMENTS_2_3,
            "emergence per Markov run",
        ),
        figures=report_figures(
            markov_figures(),
            MARKOV_DIR,
            EXPERIMENTS_2_3,
            caption_of=lambda stem: stem.split("-")[0],
            label_of=lambda stem: stem,
        ),
        pdfs=layout.figure_files(markov_figures(), MARKOV_DIR)[1::2],
        provenance=layout.aggregate_file(layout.PROVENANCE, MARKOV_DIR),
        findings=layout.aggregate_file(layout.FINDINGS, MARKOV_DIR),
    log:
        layout.log("aggregate", f"{STUDY.name}/markov"),
    conda:
        "../../envs/analysis.yaml"
    params:
        datasets=markov_datasets_json,
        emergence=section_json("emergence"),
        out_dir=provenance_dir,
        config_sha256=CONFIG_SHA256,
        # Not in the command (the step hashes the code it runs): a trigger for Snakemake.
        code_sha256=CODE_SHA256,
    shell:
        "python -m ihsweep.steps.aggregate_markov --model-tables {input.tables}"
        " --chunk-metas {input.chunks} --run-records {input.records}"
        " --run-figure {input.run_figure}"
        " --datasets {params.datasets:q} --emergence {params.emergence:q}"
        " --out-dir {params.out_dir} --config-sha256 {params.config_sha256} > {log} 2>&1"


# `snakemake figures`: every figure and table again from the cached probe tables. After the
# figures are deleted it reruns only the plotting and aggregate jobs (byte-identical files).
rule figures:
    input:
        final_outputs(),
