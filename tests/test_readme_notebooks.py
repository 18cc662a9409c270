"""The README's "Run the notebooks" section: the notebooks it names exist, and the command it gives
(``jupyter execute``) is installed by the requirements (nbclient's ``jupyter-execute``, found by ``jupyter``)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("### Run the notebooks")
    return text[start:text.index("\n## ", start)]


def test_readme_says_how_to_run_and_open_the_notebooks():
    section = _section()
    named = set(re.findall(r"notebooks/(\w+)\.ipynb", section)) | set(re.findall(r"`(\w+)`", section))
    on_disk = {name[:-6] for name in os.listdir(os.path.join(REPO, "notebooks")) if name.endswith(".ipynb")}
    assert on_disk <= named, on_disk - named  # every notebook is named
    assert "jupyter execute notebooks/quickstart.ipynb" in section and "jupyter lab" in section
    with open(os.path.join(REPO, "requirements.txt")) as f:
        assert {"nbclient", "ipykernel"} <= {line.split("==")[0].strip() for line in f}


def test_jupyter_execute_is_installed():
    """``jupyter execute`` resolves (jupyter finds nbclient's jupyter-execute beside this interpreter)."""
    bin_dir = os.path.dirname(sys.executable)
    jupyter = shutil.which("jupyter", path=bin_dir) or shutil.which("jupyter")
    assert jupyter is not None
    out = subprocess.run([jupyter, "execute", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--inplace" in out.stdout and "--output" in out.stdout
