"""Monitor: per-stage timing, returns, actor-vs-learner divergence, logs, progress and the summary.

Each logged update is one *row*: counters (update, env steps, wall time, steps/s, episodes, recent mean
episode return and length), the cumulative seconds of every stage in :data:`STAGES` (``time_<stage>_s``)
and the loop's metrics (the learner's losses, gradient norm, learning rate and importance-ratio
statistics, KL(π_learner ‖ μ_actor) and greedy agreement, ``policy_lag_versions``). The :class:`Monitor`
writes each row to one sink per output, each a module of its own with ``write(row)`` and ``close()`` (as
acme's loggers), in ``logdir``:

* ``metrics.csv`` (:mod:`.csv_sink`) and ``metrics.jsonl`` (:mod:`.jsonl_sink`): the same rows; JSON has
  ``null`` for NaN, and keeps keys a loop adds after the first row, which the CSV header cannot;
* TensorBoard event files (:mod:`.tensorboard_sink`, tensorboardX), every row's scalars against env steps;
* Weights & Biases when asked (:mod:`.wandb_sink`; ``--wandb``; :func:`require_wandb` checks it is installed);
* the console (:mod:`.console`): a rich progress bar and, every ``table_every`` logs, a compact table of the
  latest row.

Beside the sinks: the stage times (:mod:`.stages`), the episode statistics (:mod:`.episodes`), the
divergence measures (:mod:`.divergence`), ``curves.png`` at the end (:mod:`.plots`: return, stage times and
divergence against env steps; matplotlib), and the summary (:mod:`.summary`: ``summary.json``, written to a
temporary file and renamed so that a crash never leaves a half-written one (:mod:`.files`), and the table
printed at the end).

``python -m accerl_jax.plot`` draws several runs from their ``metrics.csv``. Plotting, TensorBoard, rich
and W&B are imported when first used, not with this package.
"""
from __future__ import annotations

from accerl_jax.monitor.console import LEGEND, TABLE_COLUMNS, TABLE_EVERY
from accerl_jax.monitor.core import Monitor
from accerl_jax.monitor.divergence import gaussian_policy_divergence, policy_divergence
from accerl_jax.monitor.files import atomic_write, atomic_write_json
from accerl_jax.monitor.plots import CURVE_STAGES
from accerl_jax.monitor.stages import STAGES
from accerl_jax.monitor.summary import STEPS_LEGEND, print_summary
from accerl_jax.monitor.tensorboard_sink import TENSORBOARD_GROUPS, tensorboard_tag
from accerl_jax.monitor.wandb_sink import require_wandb

__all__ = [
    "CURVE_STAGES", "LEGEND", "Monitor", "STAGES", "STEPS_LEGEND", "TABLE_COLUMNS", "TABLE_EVERY",
    "TENSORBOARD_GROUPS", "atomic_write", "atomic_write_json", "gaussian_policy_divergence",
    "policy_divergence", "print_summary", "require_wandb", "tensorboard_tag",
]
