"""The :class:`Monitor`: one object the training loop writes to, composed of the stage times, episode
statistics and one sink per output (CSV, JSON Lines, TensorBoard, W&B, console), as acme's loggers are."""
from __future__ import annotations

import os
import time

from accerl_jax.monitor import summary as summary_lib
from accerl_jax.monitor.console import TABLE_EVERY, ConsoleSink, table
from accerl_jax.monitor.csv_sink import CsvSink
from accerl_jax.monitor.episodes import EpisodeStats, mean
from accerl_jax.monitor.jsonl_sink import JsonlSink, append_line
from accerl_jax.monitor.plots import plot_curves
from accerl_jax.monitor.stages import StageTimes
from accerl_jax.monitor.tensorboard_sink import TensorBoardSink
from accerl_jax.monitor.wandb_sink import WandbSink
from accerl_jax.run.folder import is_run_file


class Monitor:
    """Collects timings and episode returns, logs them, and writes the summary.

    Args:
      logdir: output folder (created if missing).
      total_steps: planned env steps (agent steps summed over environments), for the progress bar.
      return_window: how many of the last finished episodes ``final_return_mean`` averages.
      progress: show the rich progress bar.
      append: continue the ``metrics.csv``/``metrics.jsonl`` of a resumed run (their rows are kept, and
        reloaded for ``curves.png``) instead of starting them; restore the counters with :meth:`load_state_dict`.
      wandb: keyword arguments of ``wandb.init`` (e.g. ``project``, ``config``) to log every row to Weights &
        Biases too; None (default): no W&B. The W&B run is started at the first log, in ``logdir``, with an
        id kept in :meth:`state_dict`, so a resumed run continues the same W&B run.
      table_every: print the console table every this many logs (only with ``progress``).
      purge_step: a resumed run's first env step after its checkpoint: TensorBoard hides the events of
        earlier sessions in ``logdir`` at this step and later (tensorboardX ``SummaryWriter(purge_step=...)``,
        a ``SessionLog.START`` event), so the steps logged again after a resume appear once. None: no purge.
    """

    def __init__(self, logdir: str, total_steps: int, return_window: int = 100, progress: bool = True,
                 append: bool = False, *, wandb: dict | None = None, table_every: int = TABLE_EVERY,
                 purge_step: int | None = None):
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self.total_steps = total_steps
        self.clock = StageTimes()
        self.stats = EpisodeStats(return_window)
        # --num-seeds > 1: the seeds' own Monitors. This Monitor then summarises them: its steps are one
        # seed's (the x axis every seed shares), its return and length the mean over seeds of each seed's
        # recent mean (never a pool of all seeds' episodes), its episodes the sum.
        self.seeds: list[Monitor] = []
        self.replica_word = "seed"  # what one of self.seeds is called in the console: "run" for --sweep
        self.refreshes = 0  # refreshes of the actor's policy logged by log_refresh
        self.start = time.perf_counter()
        self._tensorboard = TensorBoardSink(logdir, purge_step)
        # metrics.csv was created (claimed) by the loop before the Monitor starts; opened for writing here.
        self._csv = CsvSink(os.path.join(logdir, "metrics.csv"), append)
        self.rows: list[dict] = list(self._csv.rows)  # with those of the run it continues (append)
        self._jsonl = JsonlSink(os.path.join(logdir, "metrics.jsonl"), append)
        self._wandb = WandbSink(wandb, logdir) if wandb is not None else None
        self._console = ConsoleSink(total_steps, progress, table_every)
        self._bar_last = (0, 0.0)  # (env steps, wall seconds) at the progress bar's previous move

    # The stage times (accerl_jax.monitor.stages).
    @property
    def times(self) -> dict:
        """{stage: cumulative wall seconds} over :data:`~accerl_jax.monitor.stages.STAGES`."""
        return self.clock.times

    def add_time(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` (wall, as a stepper's :class:`accerl_jax.platform.clock.StageClock` measured them) to ``stage``."""
        self.clock.add_time(stage, seconds)

    def set_env_time(self, env_seconds: float) -> None:
        """Split the actor time of a fused actor: ``env_seconds`` to env stepping, the rest to inference."""
        self.clock.set_env_time(env_seconds)

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self.start

    # Episode statistics (accerl_jax.monitor.episodes).
    @property
    def env_steps(self) -> int:
        return self.stats.env_steps

    @property
    def episodes(self) -> int:
        return self.stats.episodes

    @property
    def episodes_nonfinite(self) -> int:
        """Finished episodes whose return is NaN or inf (e.g. an env's NaN reward): counted in ``episodes``
        and here, never averaged into return_mean / length_mean."""
        return self.stats.episodes_nonfinite

    @property
    def returns(self):
        """The returns of the last ``return_window`` finished episodes with a finite return (a deque)."""
        return self.stats.returns

    @property
    def lengths(self):
        """Their lengths in agent steps (a deque)."""
        return self.stats.lengths

    def record_episodes(self, episode_return, finished, steps: int, episode_length=None) -> None:
        """Add the returns (and lengths, in agent steps) of episodes that finished in a rollout of
        ``steps`` env steps (``[T, B]`` arrays, ``finished`` bool). An episode whose return is not finite
        is counted in ``episodes`` and ``episodes_nonfinite`` but kept out of the returns (and lengths)
        averaged."""
        self.stats.record_episodes(episode_return, finished, steps, episode_length)

    def record_steps(self, steps: int, episodes: int = 0) -> None:
        """Count ``steps`` env steps and ``episodes`` finished episodes without their returns (a
        Monitor of several seeds: the returns stay with each seed's Monitor)."""
        self.stats.record_steps(steps, episodes)

    @property
    def wandb_id(self) -> str | None:
        """The W&B run's id (None without W&B)."""
        return self._wandb.id if self._wandb is not None else None

    def state_dict(self) -> dict:
        """The counters a resumed run continues from (JSON-able): stage times, env steps, episodes, the
        returns window and the wall time so far (seconds)."""
        return {"times": dict(self.times), "env_steps": self.env_steps, "episodes": self.episodes,
                "episodes_nonfinite": self.episodes_nonfinite,
                "returns": list(self.returns), "lengths": list(self.lengths), "wall_time_s": self.wall_time,
                "wandb_id": self.wandb_id}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`; the wall clock continues from the saved wall time."""
        self.times.update(state["times"])
        self.stats.load(state)  # older checkpoints have no episodes_nonfinite and no lengths
        if self._wandb is not None and state.get("wandb_id"):
            self._wandb.id = state["wandb_id"]
        self.start = time.perf_counter() - float(state["wall_time_s"])

    @property
    def nonfinite_episodes(self) -> int:
        """Finished episodes with a non-finite return (of several seeds: the sum over the seeds)."""
        return sum(m.episodes_nonfinite for m in self.seeds) if self.seeds else self.episodes_nonfinite

    @property
    def has_returns(self) -> bool:
        """Whether an episode has finished (of any seed, for a Monitor of several seeds)."""
        return any(m.returns for m in self.seeds) if self.seeds else bool(self.returns)

    @property
    def return_mean(self) -> float:
        """Mean return of the recent finished episodes (of several seeds: the mean over the seeds that
        finished one of each seed's mean); NaN before the first."""
        if self.seeds:
            return mean([m.return_mean for m in self.seeds if m.returns])
        return mean(self.returns)

    @property
    def length_mean(self) -> float:
        """Mean length (agent steps) of the recent finished episodes (of several seeds: as
        :attr:`return_mean`); NaN before the first."""
        if self.seeds:
            return mean([m.length_mean for m in self.seeds if m.lengths])
        return mean(self.lengths)

    @property
    def table_every(self) -> int:
        return self._console.table_every

    table = staticmethod(table)

    def log(self, update: int, metrics: dict, refresh: dict | None = None, at: float | None = None) -> None:
        """Write one row to every sink (the package docstring) and refresh the progress bar.

        ``metrics``: [] scalars (floats or arrays) of the loop, added to the row under their own names.
        ``refresh``: a refresh's divergences at this row's env step, logged as :meth:`log_refresh` does,
        in the row's own TensorBoard event (one event per row instead of two).
        ``at``: the ``time.perf_counter()`` reading the row's ``wall_time_s`` is taken at (the moment its
        update's outputs reached the host, :attr:`accerl_jax.run.driver.Step.done_at`); None: now.
        """
        wall = self.wall_time if at is None else at - self.start
        row = {"update": update, "env_steps": self.env_steps, "wall_time_s": wall,
               "steps_per_s": self.env_steps / max(wall, 1e-9), "return_mean": self.return_mean,
               "length_mean": self.length_mean, "episodes": self.episodes,
               "episodes_nonfinite": self.nonfinite_episodes}
        row.update({f"time_{k}_s": v for k, v in self.times.items()})
        row.update({k: float(v) for k, v in metrics.items()})
        self._csv.write(row)
        self.rows.append(row)
        self._jsonl.write(row)
        self._tensorboard.write({**row, **self._refresh_tags(update, refresh)} if refresh else row, self.env_steps)
        if self._wandb is not None:
            self._wandb.write(row)
        self._console.write(row, per=self.replica_word if self.seeds else None)
        self.progress()

    def log_refresh(self, update: int, divergence: dict) -> None:
        """Log KL(π_learner ‖ π_actor) and agreement at a refresh of the actor's policy (TensorBoard,
        ``refresh/<name>``, against env steps); ``divergence`` as from
        :func:`~accerl_jax.monitor.divergence.policy_divergence`."""
        self._tensorboard.add_scalars(self._refresh_tags(update, divergence), self.env_steps)

    def _refresh_tags(self, update: int, divergence: dict) -> dict:
        """A refresh's TensorBoard scalars (``refresh/<name>``, ``refresh/update``), counted in
        :attr:`refreshes`."""
        self.refreshes += 1
        return {**{f"refresh/{k}": v for k, v in divergence.items()}, "refresh/update": update}

    def log_decision(self, decision: dict) -> None:
        """Record a ``--compressor auto`` decision (:mod:`accerl_jax.compressor.auto`): one JSON line in
        ``decisions.jsonl`` (with ``env_steps`` and ``wall_time_s`` added), a console line, TensorBoard text
        ``auto/decision`` and scalars ``auto/chosen_index``, ``auto/switched``, ``auto/chosen_kl`` and
        ``auto/chosen_speedup_vs_none`` (against env steps)."""
        append_line(os.path.join(self.logdir, "decisions.jsonl"),
                    dict(decision, env_steps=self.env_steps, wall_time_s=self.wall_time))
        verb = "switched to" if decision["switched"] else "kept"
        text = f"auto, update {decision['update']}: {verb} {decision['chosen']} [{decision['trigger']}] {decision['reason']}"
        self._console.print(text)
        chosen = decision["candidates"][decision["chosen"]]
        step = self.env_steps
        self._tensorboard.add_text("auto/decision", text, step)
        self._tensorboard.add_scalar("auto/chosen_index", decision["chosen_index"], step)
        self._tensorboard.add_scalar("auto/switched", float(decision["switched"]), step)
        self._tensorboard.add_scalar("auto/chosen_kl", chosen["kl"], step)
        self._tensorboard.add_scalar("auto/chosen_speedup_vs_none", chosen["speedup_vs_none"], step)

    def progress(self) -> None:
        if self._console.active:
            ret = f"{self.return_mean:.1f}" if self.has_returns else "-"
            word = self.replica_word
            phase = f"train x{len(self.seeds)} {word}s" if self.seeds else "train"  # steps per replica, mean return
            # The rate since the bar's previous move (one seed's steps with --num-seeds): what training runs at
            # now, as the summary's 'training only' rate, not the run's mean with compilation in it (the rows'
            # steps_per_s), which had read 25k steps/s beside a summary of 100k. The first move: the mean.
            steps, wall = self.env_steps, self.wall_time
            last_steps, last_wall = self._bar_last
            sps = (steps - last_steps) / (wall - last_wall) if last_wall and wall > last_wall else steps / max(wall, 1e-9)
            self._bar_last = (steps, wall)
            self._console.update(completed=steps, phase=phase, sps=sps, ret=ret,
                                 unit=f"steps/s/{word}" if self.seeds else "steps/s")

    def flush(self) -> None:
        """Write the row files' buffered rows now (``metrics.csv``, ``metrics.jsonl``, the TensorBoard events;
        they are flushed at most once a second while the run goes on, :data:`accerl_jax.monitor.files.FLUSH_EVERY_S`)."""
        self._csv.flush()
        self._jsonl.flush()
        self._tensorboard.flush()

    def close(self) -> None:
        """Stop the progress bar and close the log files (safe to call twice)."""
        if self._csv.closed:
            return
        if self._console.active:
            self.progress()
            self._console.close()
        self._tensorboard.close()
        self._csv.close()
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.close()

    def plot(self, title: str) -> str | None:
        """Write ``curves.png`` from the logged rows; returns its path (None if nothing was logged)."""
        return plot_curves(self.rows, title, os.path.join(self.logdir, "curves.png"))

    def discard(self) -> None:
        """Remove the files this Monitor created (for a run stopped before its first update)."""
        for name in os.listdir(self.logdir):
            if is_run_file(name):
                os.remove(os.path.join(self.logdir, name))
        if not os.listdir(self.logdir):
            os.rmdir(self.logdir)

    def write_summary(self, summary: dict) -> None:
        """Write ``summary.json`` atomically."""
        summary_lib.write_summary(self.logdir, summary)
