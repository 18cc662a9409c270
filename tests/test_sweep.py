"""--sweep: the learner's hyperparameters as an input of the Anakin program, every combination of swept values
trained side by side in one vmapped program (accerl_jax.run.replicas), each run equal to the same run alone."""
from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest

from accerl_jax import learner as learner_lib
from accerl_jax import run_training
from accerl_jax.run import checkpoint, replicas
from accerl_jax.config import Config, ConfigError
from tiny_config import tiny_config

UPDATES = 4
tiny = functools.partial(tiny_config, updates=UPDATES, num_envs=4, compressor="none", loop="anakin",
                         anneal_lr=False, checkpoint_every=2)
SWEEP = ("learning_rate=0.001,0.004", "entropy_coef=0,0.02")
FOLDERS = ["learning_rate=0.001,entropy_coef=0-seed0", "learning_rate=0.001,entropy_coef=0.02-seed0",
           "learning_rate=0.004,entropy_coef=0-seed0", "learning_rate=0.004,entropy_coef=0.02-seed0"]


def test_sweepable_names_are_the_learners_traced_hyperparameters():
    assert set(replicas.SWEEPABLE) == set(learner_lib.HYPER)
    reps = replicas.replicas(Config(sweep=SWEEP, num_seeds=2, seed=5))
    assert [r.folder for r in reps[::2]] == FOLDERS and [r.seed for r in reps[:2]] == [5, 6]
    assert reps[5].values == {"learning_rate": 0.004, "entropy_coef": 0.0} and reps[5].seed == 6


def test_sweep_runs_equal_separate_runs_resume_and_another_value_compiles_nothing(tmp_path, capsys):
    """One program of 4 combinations: each run's summary and parameters are those of the same run trained
    alone; a sweep stopped halfway and resumed ends where the uninterrupted one does (each run keeps its
    own values); a run with other values of every traced hyperparameter loads all its programs from the
    compilation cache."""
    swept = run_training(tiny(tmp_path / "sweep", sweep=SWEEP))
    assert swept["num_seeds"] == 4 and [p["run"] for p in swept["seeds"]] == FOLDERS
    assert swept["seeds"][3]["swept"] == {"learning_rate": 0.004, "entropy_coef": 0.02}
    with open(tmp_path / "sweep" / FOLDERS[3] / "summary.json") as f:
        own = json.load(f)
    assert own["config"]["learning_rate"] == 0.004 and own["config"]["entropy_coef"] == 0.02
    assert own["config"]["sweep"] == []
    alone = run_training(tiny(tmp_path / "alone", learning_rate=0.004, entropy_coef=0.02))
    for key in ("updates", "total_env_steps", "episodes", "final_return_mean"):
        assert own[key] == alone[key], key
    a = checkpoint.read_leaves(str(tmp_path / "sweep"), UPDATES)
    b = checkpoint.read_leaves(str(tmp_path / "alone"), UPDATES)
    for path in b:
        if path.startswith(".learner"):
            np.testing.assert_allclose(a[path][3], b[path], rtol=1e-5, atol=1e-6, err_msg=path)
    # The other combinations trained with their own values: their parameters differ from it.
    kernels = [p for p in b if p.startswith(".learner.params") and p.endswith("['kernel']")]
    assert kernels and not any(np.allclose(a[p][k], b[p]) for p in kernels[:1] for k in range(3))

    # Stopped after half the budget and resumed: each run goes on with its own values.
    half = tiny(tmp_path / "resumed", sweep=SWEEP, total_steps=4 * 8 * UPDATES // 2, progress=True)
    capsys.readouterr()
    run_training(half)
    out = capsys.readouterr().out  # the console counts one run's steps, and says "run", not "seed"
    assert "x4 runs" in out and "steps/s/run" in out and "/seed" not in out, out[-2000:]
    resumed = run_training(tiny(None, sweep=SWEEP, resume=str(tmp_path / "resumed")))
    assert resumed["updates"] == UPDATES
    c = checkpoint.read_leaves(str(tmp_path / "resumed"), UPDATES)
    for path in a:
        if path.startswith(".learner"):
            np.testing.assert_allclose(c[path], a[path], rtol=1e-5, atol=1e-6, err_msg=path)

    # Every traced value changed: the programs are the ones compiled above (the persistent cache's hits).
    other = run_training(tiny(tmp_path / "other", learning_rate=0.0025, entropy_coef=0.005, value_coef=0.25,
                              discount=0.95, lambda_=0.9, clip_rho_threshold=2.0, clip_pg_rho_threshold=1.5,
                              ppo_clip=0.3, max_grad_norm=1.0))
    assert other["compile_cache_misses"] == 0 and other["compile_cache_hits"] > 0, other

    # The printed plot command names each run's folder; they plot as one figure of four groups, one per
    # combination, labelled by its values.
    from accerl_jax import plot
    from accerl_jax.train import plot_command

    folders = plot_command(swept).split()[3:]
    assert folders == [str(tmp_path / "sweep" / f) for f in FOLDERS]
    groups = plot.group_runs([plot.load_run(f) for f in folders])
    assert len(groups) == 4
    labels = [label for label, _ in groups]
    assert any("--learning-rate 0.004" in label and "--entropy-coef 0.02" in label for label in labels), labels
    assert plot.main([*folders, "--out", str(tmp_path / "plots")]) == 0
    assert os.path.exists(tmp_path / "plots" / "returns.png")


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "learning_rate=1e-3,2e-3", "--sweep", "entropy_coef=0,0.01"],
     "bad --sweep given twice: the later one would replace the earlier"),
    (["--sweep", "learning_rate=1e-3,2e-3", "--learning-rate", "5e-3"],
     "bad --learning-rate with --sweep learning_rate=...: the sweep's values replace it"),
    (["--sweep", "lambda=0.9,0.95", "--lambda", "0.8"], "bad --lambda with --sweep lambda_=..."),
])
def test_a_command_line_that_says_a_swept_value_twice_is_refused(argv, message):
    from accerl_jax import train

    with pytest.raises(ConfigError, match=re.escape(message)):
        train.parse_config(argv)
    assert train.parse_config(argv[:2]).sweep == (argv[1],)


def test_a_yaml_list_that_splits_an_item_at_its_commas_says_to_quote_it(tmp_path):
    from accerl_jax import train

    path = tmp_path / "sweep.yaml"
    path.write_text("sweep: [learning_rate=1e-3,2e-3]\n")
    with pytest.raises(ConfigError, match=re.escape('quote each item, e.g. sweep: ["learning_rate=1e-3,2e-3"]')):
        train.parse_config(["--config", str(path)])
    path.write_text('sweep: ["learning_rate=1e-3,2e-3", entropy_coef=0]\n')
    assert train.parse_config(["--config", str(path)]).sweep == ("learning_rate=1e-3,2e-3", "entropy_coef=0")
    path.write_text("sweep: learning_rate=1e-3,2e-3\n")
    assert train.parse_config(["--config", str(path)]).sweep == ("learning_rate=1e-3,2e-3",)


def test_a_runs_own_folder_points_to_its_parent_run(tmp_path):
    """evaluate or --resume given one replica's folder (seed<k>/, <values>-seed<k>/) name the run folder that
    holds the checkpoints, with --seed-index for evaluate."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "learning_rate=0.001-seed1").mkdir()
    one = str(tmp_path / "run" / "learning_rate=0.001-seed1")
    with pytest.raises(ConfigError, match=re.escape(f"give {str(tmp_path / 'run')!r} with --seed-index")):
        checkpoint.find_checkpoint(one, "RUN_DIR")
    with pytest.raises(ConfigError, match=re.escape("(all its runs resume together)")):
        checkpoint.find_checkpoint(one, "--resume")
