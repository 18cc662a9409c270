"""The package's module docstrings say what a module is for and why; they quote no measured time.

A time measured on one machine ("~24 s on a loaded 2-core CPU") goes stale with the machine, the load and
the library versions; measurements live in docs/RESULTS.md and the code keeps the reason.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "accerl_jax"
# A number with a unit of time, a speed ratio, or the machine it was measured on.
MEASURED = re.compile(
    r"\d(?:\.\d+)?\s?(?:s|ms|µs|us|ns|min|h|seconds?|minutes?|hours?)\b"
    r"|\d(?:\.\d+)?\s?x\s(?:faster|slower|as fast)"
    r"|\d+-core\b"
)
MODULES = sorted(PACKAGE.rglob("*.py"))


def measured_times(text: str) -> list[str]:
    """The phrases of ``text`` that read as a measured time."""
    return [m.group(0) for m in MEASURED.finditer(text)]


def test_the_pattern_finds_measured_times_and_passes_plain_numbers():
    for text in ("compiling a second length cost ~24 s on a loaded CPU", "3.8 s against 5.6-5.9 s",
                 "~1.1 ms per update", "runs 20x slower", "on a 2-core CPU", "takes 3 minutes"):
        assert measured_times(text), text
    for text in ("``[T, B, A]`` float32", "int8 x int8 products", "16 envs x 16 steps", "AcceRL section 3",
                 "YAML 1.2", "policy_lag_versions", "10% above ρ̄", "arXiv 2211.15023"):
        assert not measured_times(text), text


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_module_docstring_quotes_no_measured_time(path):
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert not measured_times(docstring), (f"{path.relative_to(PACKAGE.parent)}: the module docstring quotes "
                                           f"{measured_times(docstring)}; keep the reason, measurements go in "
                                           "docs/RESULTS.md")
