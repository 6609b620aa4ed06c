"""The training step's progress: a bar in a terminal, the timed lines in a log.

``python -m ihsweep.steps.train`` runs here for real, once under a pseudo-terminal (``pty``:
its stderr is a terminal, as when a person runs the step) and once with its output going to
pipes (as under Snakemake, which writes it to the run's log). The terminal gets a tqdm bar
with the tokens done of the budget, tokens/s, the ETA and the last loss, and no progress
lines; the log gets the progress lines it always had and no bar.
"""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest
from conftest import SCHEMA, write_chunks
from ihsweep.steps.prepare import prepare

V, C, B, STEPS = 64, 32, 4, 400
PROGRESS_LINE = re.compile(
    r"^\[toy/toy/B4-C32-s0\] step \d+/400 \| tokens \d+\.\d\dM \| loss \d+\.\d{4} \|"
    r" \d+\.\dk tok/s \| \d+\.\d GFLOP/s \| ETA \d+m\d\ds$"
)


@pytest.fixture
def step_command(tmp_path):
    """The step's command line for a toy run of 400 updates in ``run``, a progress line every
    second."""
    rng = np.random.default_rng(0)
    data = write_chunks(
        tmp_path / "data",
        {"train": rng.integers(0, V, (96, C)), "val": rng.integers(0, V, (8, C))},
        V,
    )
    config = {
        "models": {"toy": {"n_layer": 1, "n_head": 1, "d_model": 16, "mlp": False, "n_ctx": C}},
        "datasets": {
            "toy": {
                "family": "natural",
                "corpus": {"source": "kjv"},
                "tokenizer": {"kind": "bpe", "vocab_size": 258},
            }
        },
        "runs": [{"data": "toy", "model": "toy", "batch_size": B, "context_size": C}],
        "training": {"tokens": STEPS * B * C, "val_batches": 1},
        "checkpoints": {"tokens": [STEPS * B * C]},
        "probe": {"min_layer": 0},
    }
    study = prepare(config, SCHEMA)
    spec = study.train_spec(study.runs[0])
    return lambda run: [
        sys.executable, "-m", "ihsweep.steps.train", "--spec", json.dumps(spec),
        "--data-dir", str(data), "--run-dir", str(tmp_path / run), "--device", "cpu",
        "--threads", "1", "--progress-seconds", "1",
    ]  # fmt: skip


def run_in_terminal(command: list[str], columns: int = 120) -> str:
    """Run ``command`` with a pseudo-terminal of ``columns`` as its stdin, stdout and stderr;
    everything it wrote to the terminal."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end closed with the process
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, output.decode(errors="replace")
    return output.decode()


@pytest.mark.slow
def test_a_terminal_gets_a_bar_and_a_log_the_progress_lines(step_command):
    shown = run_in_terminal(step_command("in-terminal"))
    # The bar redraws in place (carriage returns); its last state: every token of the
    # budget, the speed, no time left, and the mean loss of the last progress window.
    parts = re.split(r"[\r\n]+", shown)  # a bar's states and the lines printed above it
    states = [part for part in parts if "|" in part and "tok/s" in part]
    assert states, shown
    final = states[-1]
    budget = f"{STEPS * B * C / 1e3:.1f}k"
    assert final.startswith("toy/toy/B4-C32-s0: 100%|") and f"{budget}/{budget} [" in final
    assert re.search(r"<00:00, \d+(\.\d+)?ktok/s, loss=\d+\.\d{4}\]$", final), final
    # A bar mid-way: a share of the budget below 100% and an ETA.
    assert any(re.search(r": +\d{1,2}%\|.*<\d\d:\d\d,", s) for s in states), states
    assert not any(PROGRESS_LINE.match(part) for part in parts)  # the bar replaces them
    # Printed lines go above the bar (tqdm clears it, writes the line, redraws it), whole.
    assert any(part.startswith("[toy/toy/B4-C32-s0] done: 400 of 400 steps") for part in parts)

    logged = subprocess.run(step_command("logged"), capture_output=True, text=True, timeout=300)
    assert logged.returncode == 0, logged.stderr
    log = logged.stdout.splitlines()
    progress = [line for line in log if PROGRESS_LINE.match(line)]
    assert progress and progress[-1].startswith("[toy/toy/B4-C32-s0] step 400/400 | tokens 0.05M")
    assert "tok/s]" not in logged.stdout + logged.stderr and "%|" not in logged.stderr
