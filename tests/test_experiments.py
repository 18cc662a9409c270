"""The experiment scripts write only where they are told (experiments/results/ holds committed tables)."""
from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _paper_tables():
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        import paper_tables
    finally:
        sys.path.pop(0)
    return paper_tables


def test_paper_tables_writes_beside_out_or_into_results_dir_never_into_the_committed_tables(tmp_path):
    pt = _paper_tables()
    out = str(tmp_path / "mine" / "quick.json")
    assert pt.output_paths(out, None, True, "cpu-2core") == (str(tmp_path / "mine"), out)
    assert pt.report_path(out) == str(tmp_path / "mine" / "quick.md")
    elsewhere = str(tmp_path / "plots")
    assert pt.output_paths(out, elsewhere, True, "cpu-2core") == (elsewhere, out)
    assert pt.output_paths(None, elsewhere, False, "cpu-2core") == (elsewhere, os.path.join(elsewhere, "paper_tables.json"))
    committed = os.path.join(REPO, "experiments", "results", "cpu-2core")
    assert pt.output_paths(None, None, True, "cpu-2core") == (committed, os.path.join(committed, "paper_tables_quick.json"))
    assert pt.report_path(os.path.join(committed, "paper_tables_quick.json")) == os.path.join(committed, "paper_tables_quick.md")
