"""Rule ``export``: one checkpoint of a run as a Hugging Face GPT-2 model folder
(``ihsweep.training.hf_export``).

    python -m ihsweep.steps.export results/runs/<run id> OUT_DIR [--step N]
    python -m ihsweep.steps.export results/runs/<run id>/ckpt/step_000500.json OUT_DIR

``OUT_DIR`` gets ``config.json``, ``model.safetensors`` and ``ihsweep_spec.json``, which
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads with no code of ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ihsweep.steps import _args
from ihsweep.training.hf_export import export_checkpoint, find_checkpoint


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("export", "Export one checkpoint of a run as a Hugging Face GPT-2 folder.")
    p.add_argument(
        "checkpoint",
        type=Path,
        help="a run folder (its newest checkpoint, or --step) or a checkpoint's .json file",
    )
    p.add_argument("out_dir", type=Path, help="the model folder to write")
    p.add_argument("--step", type=int, help="with a run folder: the checkpoint's step")
    args = p.parse_args(argv)
    try:
        meta = find_checkpoint(args.checkpoint, args.step)
        out = export_checkpoint(meta, args.out_dir)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(err, file=sys.stderr)  # a missing step, a damaged file: its name, not a traceback
        return 1
    print(f"exported step {meta['step']} of {meta.get('run_id', '?')} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
