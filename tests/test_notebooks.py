"""The notebooks' code cells run as written (so the worked examples do not rot)."""
from __future__ import annotations

import json
import os

import pytest

NB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
NOTEBOOKS = sorted(f for f in os.listdir(NB_DIR) if f.endswith(".ipynb"))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name):
    with open(os.path.join(NB_DIR, name)) as f:
        nb = json.load(f)
    code = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    namespace: dict = {}
    exec(compile(code, name, "exec"), namespace)  # noqa: S102 - our own notebook
    if name == "custom_compressor.ipynb":
        assert list(namespace["state"]) == ["distill", "bf16"]
