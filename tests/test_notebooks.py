"""Every notebook in notebooks/ runs top to bottom in a Jupyter kernel (nbclient), as a reader would run
it, and is stored without outputs. A new notebook is picked up automatically; the tables below
add checks of what some of them must produce."""
from __future__ import annotations

import os

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
    "custom_compressor.ipynb": ["['distill', 'fp16']", "distill:small+fp16 6 updates"],
    "custom_env.ipynb": ["(random policy: 5, best: 10)"],
}


def _read(name: str):
    return nbformat.read(os.path.join(NB_DIR, name), as_version=4)


def test_notebooks_found():
    assert {"quickstart.ipynb", "custom_compressor.ipynb"} <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name):
    for i, cell in enumerate(_read(name).cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} cell {i} has stored outputs"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, tmp_path):
    nb = _read(name)
    # The kernel runs in tmp_path (files the notebook writes land there) with this process's environment.
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for path in EXPECTED_FILES.get(name, []):
        assert (tmp_path / path).is_file(), path
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    for expected in EXPECTED_TEXT.get(name, []):
        assert expected in text, (expected, text[-2000:])
