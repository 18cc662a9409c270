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


def _script(name):
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_measure_all_gives_every_table_an_output_place_under_out(tmp_path):
    ma = _script("measure_all")
    out = str(tmp_path / "m")
    tables = ma.tables("run2", out)
    assert len({n for n, _ in tables}) == len(tables)
    for name, argv in tables:
        places = [a for a in argv[1:] if os.path.isabs(a) and not a.endswith(".py")]
        assert places, f"{name} is given no output place"
        assert all(p.startswith(out + os.sep) for p in places), (name, places)
        assert any(p.startswith(os.path.join(out, "run2")) for p in places), name


def test_results_page_shows_both_runs_and_one_value_when_equal(tmp_path):
    rp = _script("results_page")
    assert rp.pair(1.0, 1.0, ".1f") == "1.0"
    assert rp.pair(1.0, 1.26, ".1f", "x") == "1.0x / 1.3x"
    assert rp.pair(None, 2, ".0f") == "— / 2"
    for run, value in (("run1", 500.0), ("run2", 437.5)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "solve_cartpole.json").write_text(
            '{"command": "python -m accerl_jax.train --seed S", "runs": [{"seed": 0, "final_return_mean": %s, '
            '"wall_time_s": 20.0, "process_time_s": 25.0, "steps_per_s": 40000}]}' % value)
    text = rp.page(str(tmp_path))
    assert "| 0 | 500.0 / 437.5 | 20.0 | 25.0 | 40,000 |" in text


def test_device_check_refuses_gpu_when_jax_sees_none(tmp_path, capsys):
    """``--device gpu`` (the default) on a machine without a GPU: exit 2, one line naming what JAX sees, no file."""
    import pytest

    out = tmp_path / "dc.json"
    with pytest.raises(SystemExit) as exit_:
        _script("device_check").main(["--out", str(out)])
    assert exit_.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device gpu, but JAX sees no GPU (backend 'cpu'" in err


def test_device_check_quick_writes_one_json_with_each_part_in_its_own_budget(tmp_path):
    """The CPU smoke mode: the main job's part finishes (its numbers in the JSON); a part that runs out of
    its own budget is stopped and recorded as timed out, without results, and the JSON is still written."""
    out = tmp_path / "dc.json"
    got = _script("device_check").main(["--device", "cpu", "--quick", "--parts", "main_job", "sebulba",
                                        "--budget-main-job", "600", "--budget-sebulba", "2", "--out", str(out)])
    import json

    assert json.loads(out.read_text()) == json.loads(json.dumps(got))
    assert got["backend"] == "cpu" and got["jax"] and got["git_revision"] and got["devices"] == ["cpu:0"]
    main, seb = got["parts"]["main_job"], got["parts"]["sebulba"]
    assert main["returncode"] == 0 and not main["timed_out"], main["output_tail"]
    r = main["result"]
    assert r["total_env_steps"] == 1024 and r["steps_per_s"] > 0 and r["wall_time_s"] > 0 and r["stopped"] is None
    assert isinstance(main["load_average_1min_before"], float) and main["command"][1:3] == ["-m", "accerl_jax.train"]
    assert seb["timed_out"] and seb["result"] is None and seb["returncode"] is None and seb["wall_s"] < 30
    assert "actor_bound.py" in " ".join(seb["command"]) and "actor_time" not in got["parts"]


def test_paper_tables_shows_each_methods_ceiling_from_its_runs_summaries():
    """The training table's Amdahl ceiling column: a run's own summary.json cost split; a method's row takes
    the timed ceilings where any run timed its pieces, else the FLOPs ones (marked)."""
    pt = _paper_tables()
    timed = {"cost_split": {"ceiling": 0.2, "ceiling_source": "timed", "actor_share": 0.1}}
    counted = {"cost_split": {"ceiling": 0.1, "ceiling_source": "flops", "actor_share": 0.05}}
    assert pt.ceiling_of(timed) == {"ceiling": 0.2, "ceiling_source": "timed", "actor_share": 0.1}
    assert pt.ceiling_of({"cost_split": None})["ceiling"] is None  # e.g. --compressor auto
    runs = [dict(pt.ceiling_of(s), seed=k, final_return=500.0, time_to_target_s=10.0 + k, wall_time_s=20.0)
            for k, s in enumerate((timed, counted, counted))]
    row = pt.aggregate(runs)
    assert (row["ceiling"], row["ceiling_source"]) == (0.2, "timed")
    assert pt.aggregate(runs[1:])["ceiling_source"] == "flops"
    table = {"env": "gymnax:CartPole-v1", "target": 475.0, "target_note": "", "steps": 1000,
             "methods": {"none": dict(row, runs=runs), "int8": dict(pt.aggregate(runs[1:]), runs=runs[1:])}}
    pt.compare(table)
    result = {"training": {"cartpole": table}, "quick": False, "actor_time": {}, "suffix": "",
              "targets": {}}
    lines = pt._training_lines(result, []).splitlines()
    header = next(line for line in lines if "Amdahl ceiling" in line and line.startswith("|"))
    column = [c.strip() for c in header.split("|")].index("Amdahl ceiling")
    cells = [[c.strip() for c in line.split("|")] for line in lines if line.startswith("| ") and "`" in line]
    assert [c[column] for c in cells] == ["≤ 20.0%", "≤ 10.0% (FLOPs)"]
    assert cells[1][column - 1] == "-4.5%"  # beside the time-to-target reduction: medians 11 s -> 11.5 s


def test_results_page_reads_the_committed_actor_bound_runs():
    """The actor-bound table of the results page, from the two committed runs: one row per compressor,
    both runs' throughput ratio side by side."""
    import json

    rp = _script("results_page")
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "results", "cpu-2core")
    a, b = (json.load(open(os.path.join(folder, f"actor_bound_run{r}.json"))) for r in (1, 2))
    lines = rp.actor_bound(a, b)
    rows = [ln for ln in lines if ln.startswith("| `")]
    assert len(rows) == len(a["methods"]) and any(ln.startswith("| `none` |") for ln in rows)
    ratio = a["methods"]["prune:0.5"]["throughput_ratio"], b["methods"]["prune:0.5"]["throughput_ratio"]
    assert f"{ratio[0]:.2f}x / {ratio[1]:.2f}x" in next(ln for ln in rows if "prune:0.5" in ln)


def test_peer_purejaxrl_times_the_target_from_process_start_and_tabulates_ratios(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        import peer_purejaxrl as peer
    finally:
        sys.path.pop(0)
    (tmp_path / "metrics.csv").write_text("env_steps,wall_time_s,return_mean\n1,2.0,\n2,4.0,300\n3,6.0,480\n4,8.0,500\n")
    assert peer.time_to_target(str(tmp_path), 3.0) == 9.0  # 3 s before training + the row's 6 s
    (tmp_path / "metrics.csv").write_text("env_steps,wall_time_s,return_mean\n1,2.0,nan\n2,4.0,474.9\n")
    assert peer.time_to_target(str(tmp_path), 3.0) is None
    run = lambda s, r: {"process_s": s, "time_to_target_s": s, "final_return": r}  # noqa: E731
    configs = {"default": {"process_s": 30.0, "time_to_target_s": None, "runs": [dict(run(30.0, None), time_to_target_s=None)]},
               "purejaxrl": {"process_s": 20.0, "time_to_target_s": 20.0, "runs": [run(20.0, 500.0)]}}
    md = peer.to_markdown({"host": "h", "cpu_count": 2, "seeds": [0], "configs": configs})
    assert "| default | 30.0 | - (0 of 1) | - | 1.50 | - |" in md
    assert "| purejaxrl | 20.0 | 20.0 (1 of 1) | 500 | 1.00 | 1.00 |" in md
    assert peer._median([{"t": None}, {"t": 3.0}, {"t": 5.0}], "t") == 4.0  # over the runs that reached it


def test_sweep_defaults_tabulates_every_seed_and_counts_the_misses():
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        import sweep_defaults as sweep
    finally:
        sys.path.pop(0)
    run = lambda t, r, p: {"time_to_target_s": t, "final_return": r, "process_s": p}  # noqa: E731
    result = {"host": "h", "cpu_count": 2, "seeds": [0, 1, 2], "configs": {
        "default": {"flags": "", "runs": [run(8.0, 500.0, 12.0), run(10.0, 496.0, 13.0), run(9.0, 500.0, 11.0)]},
        "slow": {"flags": "--epochs 4", "runs": [run(None, 218.0, 11.0), run(20.0, 490.0, 12.0), run(None, None, 10.0)]}}}
    md = sweep.to_markdown(result)
    assert "| default | `(none)` | 3 of 3 | 9.0 (8.0, 10.0, 9.0) | 12.0 | 500, 496, 500 |" in md
    assert "| slow | `--epochs 4` | 1 of 3 | 20.0 (never, 20.0, never) | 11.0 | 218, 490, - |" in md
    assert set(sweep.CONFIGS) >= {"default", "old-default"} and sweep.CONFIGS["default"] == ""


def test_startup_ab_parses_checkouts_and_tabulates_both_kinds_of_run_with_ratios():
    import pytest

    ab = _script("startup_ab")
    assert ab.checkout("new=python3:.") == ("new", "python3", os.path.abspath("."))
    for bad in ("new", "new=python3", "=python3:.", "new=:."):
        with pytest.raises(SystemExit, match="LABEL=PYTHON:FOLDER"):
            ab.checkout(bad)
    run = lambda p, s, b, t, r: {"process_s": p, "startup_s": s, "startup_before_train_s": b,  # noqa: E731
                                 "time_to_target_s": t, "final_return": r}
    configs = {}
    for label, scale in (("old", 1.0), ("new", 0.5)):
        for kind, warm in (("cold", 1.0), ("warm", 0.5)):
            runs = [run(20 * scale * warm, 10 * scale * warm, 4 * scale, 12 * scale * warm, 500.0),
                    run(22 * scale * warm, 11 * scale * warm, 4 * scale, None, 300.0)]
            configs[f"{label}, {kind}"] = dict({k: ab._median(runs, k) for k in ab.KEYS}, runs=runs)
    md = ab.to_markdown({"host": "h", "cpu_count": 2, "seeds": [0, 1], "flags": "", "labels": ["old", "new"],
                         "configs": configs})
    assert "| old | cold | 21.00 | 10.50 | 4.00 | 12.00 | 500, 300 |" in md
    assert "| new | warm | 5.25 | 2.62 | 2.00 | 3.00 | 500, 300 |" in md
    assert "| cold | 0.50 | 0.50 | 0.50 | 0.50 |" in md and "| warm | 0.50 | 0.50 | 0.50 | 0.50 |" in md
