"""The report's front-page paragraph on model families: each family's law side by side, and
the differences from gpt2 with their intervals (``ihsweep.analysis.families``, lawfit.json's
``families``; docs/method.md#model-families)."""

from __future__ import annotations

from ihsweep.report import rst


def family_findings(fit: dict | None) -> str:
    """Each model family's law side by side, and the differences from gpt2 with their
    intervals (``analysis.families``, lawfit.json's ``families``); "" for one family."""
    comparison = (fit or {}).get("families")
    if not comparison:
        return ""
    laws = comparison["families"]
    rows = [["", *(f"{family} [95% CI]" for family in laws)]]
    centre = comparison.get("centre") or {}
    at_centre = "log10 updates at B {}, C {} (the grid's centre)".format(
        *(rst.number(centre.get(key)) for key in ("batch_size", "context_size"))
    )
    for key, label in (("a", "a (exponent of B)"), ("b", "b (exponent of C)"),
                       ("log10_T", "log10 T"), ("log10_U_centre", at_centre)):  # fmt: skip
        rows.append([label, *(_estimate(law, key) for law in laws.values())])
    rows.append(["r", *(rst.number(law.get("r")) for law in laws.values())])
    rows.append(["runs fitted", *(str(law.get("n_runs", 0)) for law in laws.values())])
    differences = []
    for family, diff in comparison["differences"].items():
        if not diff["ok"]:
            differences.append(f"{family} - {comparison['reference']}: not compared"
                               f" ({diff['reason']}).")  # fmt: skip
            continue
        parts = [
            f"{label} {rst.number(diff[key])} {rst.interval(diff[f'{key}_ci'])}"
            + (" (excludes 0)" if diff[f"{key}_excludes_zero"] else "")
            for key, label in (
                ("a", "a"),
                ("b", "b"),
                ("log10_T", "log10 T"),
                ("log10_U_centre", "log10 updates at the centre"),
            )  # fmt: skip
        ]
        differences.append(f"{family} - {comparison['reference']}: " + ", ".join(parts) + ".")
    intro = (
        "Model families: the law fitted to each family's runs alone, with its own bootstrap;"
        " the differences' 95% intervals are those of the two independent bootstraps"
        " (families.csv). " + _metric_caveat(comparison.get("metric"))
    )
    return "\n\n".join([rst.text(intro), rst.list_table(rows), rst.text(" ".join(differences))])


def _metric_caveat(metric: str | None) -> str:
    """What the emergence metric can date on a rotary model (docs/method.md#content-ps)."""
    if metric == "ps_content_max":
        return (
            "Emergence is dated on content PS, which a head that looks back by position alone"
            " does not score (docs/method.md#content-ps)."
        )
    if metric == "ps_max":
        return (
            "Emergence is dated on ps_max: with rotary positions a layer-1 head can look back by"
            " position and pass the PS probe, as the llama runs' did on our text"
            " (docs/results.md#model-families); date rotary models on ps_content_max"
            " (docs/method.md#content-ps)."
        )
    return f"Emergence is dated on {metric}."


def _estimate(law: dict, key: str) -> str:
    if not law.get("ok") or law.get(key) is None:
        return f"not fitted: {law.get('reason') or 'no fit'}"
    ci = law.get(f"{key}_ci")
    return f"{rst.number(law[key])} {rst.interval(ci)}" if ci else rst.number(law[key])
