"""Every notebook in notebooks/ runs top to bottom in a Jupyter kernel (nbclient), as a reader would run
it (at a smaller budget where :data:`CI_BUDGET` says so), and is stored with the outputs of one run top
to bottom at its own budget. A new notebook is picked up automatically; the tables below add checks of
what some of them must produce."""
from __future__ import annotations

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

NB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
NOTEBOOKS = sorted(f for f in os.listdir(NB_DIR) if f.endswith(".ipynb"))
# Files a notebook must leave in its working folder.
EXPECTED_FILES = {
    "quickstart.ipynb": ["runs/quickstart-s0/summary.json", "runs/quickstart-s1/metrics.jsonl",
                         "runs/quickstart-plots/returns.png", "runs/quickstart-plots/time_breakdown.png",
                         "runs/quickstart-plots/divergence.png", "runs/quickstart-s0/eval.json",
                         "runs/quickstart-episode.gif", "runs/quickstart-exported/policy.jax"],
    "custom_compressor.ipynb": ["runs/custom-fp16/summary.json"],
    "custom_env.ipynb": ["runs/custom-env-lever/summary.json"],
}
# Text a notebook's outputs must contain.
EXPECTED_TEXT = {
    "quickstart.ipynb": ["seed 0: final return", "seed 1: final return"],
    "custom_compressor.ipynb": ["['distill', 'fp16']", "distill:small+fp16 6 updates", "KL(learner || actor) = "],
    "custom_env.ipynb": ["(random policy: 5, best: 10)"],
}


# (source text, what the test runs instead): a notebook's budget cut for CI. The notebook's stored outputs are
# those of its own budget; this test checks that it runs, not what it learns at that budget.
CI_BUDGET = {
    "quickstart.ipynb": ("TOTAL_STEPS = 200_000", "TOTAL_STEPS = 16 * 16 * 40"),
}
# CartPole-v1 counts as solved at a mean return of 475 (its maximum is 500).
SOLVED = 475.0


def _read(name: str):
    return nbformat.read(os.path.join(NB_DIR, name), as_version=4)


def test_notebooks_found():
    assert {"quickstart.ipynb", "custom_compressor.ipynb"} <= set(NOTEBOOKS)


def _text(nb) -> str:
    return "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_with_the_outputs_of_one_run_top_to_bottom(name):
    code = [cell for cell in _read(name).cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), f"{name}: execute it whole"
    assert not [out for cell in code for out in cell.outputs if out.output_type == "error"], name
    assert any(cell.outputs for cell in code), name


def test_the_stored_quickstart_solves_cartpole_on_every_seed_it_trains():
    """What the shipped quickstart shows: each seed it trains ends at a return of at least :data:`SOLVED`."""
    finals = re.findall(r"seed (\d+): final return ([\d.]+)", _text(_read("quickstart.ipynb")))
    assert [seed for seed, _ in finals] == ["0", "1"] and all(float(r) >= SOLVED for _, r in finals), finals


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, tmp_path):
    nb = _read(name)
    if name in CI_BUDGET:
        full, tiny = CI_BUDGET[name]
        cells = [cell for cell in nb.cells if full in cell.source]
        assert len(cells) == 1, f"{name} no longer sets {full!r}: update CI_BUDGET"
        cells[0].source = cells[0].source.replace(full, tiny)
    # The kernel runs in tmp_path (files the notebook writes land there) with this process's environment.
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for path in EXPECTED_FILES.get(name, []):
        assert (tmp_path / path).is_file(), path
    text = _text(nb)
    for expected in EXPECTED_TEXT.get(name, []):
        assert expected in text, (expected, text[-2000:])
