"""Monitor: per-stage timing, returns, actor-vs-learner divergence, logs, progress and the summary.

Each logged update is one *row*: counters (update, env steps, wall time, steps/s, episodes, recent mean
episode return and length), the cumulative seconds of every stage in :data:`STAGES` (``time_<stage>_s``)
and the loop's metrics (the learner's losses, gradient norm, learning rate and importance-ratio
statistics, KL(π_learner ‖ μ_actor) and greedy agreement, ``policy_lag_versions``). Sinks, in ``logdir``:

* ``metrics.csv`` and ``metrics.jsonl`` (the same rows; JSON has ``null`` for NaN, and keeps keys a loop
  adds after the first row, which the CSV header cannot);
* TensorBoard event files (tensorboardX), every row's scalars against env steps;
* Weights & Biases when asked (``--wandb``; :func:`require_wandb` checks it is installed);
* the console: a rich progress bar and, every ``table_every`` logs, a compact table of the latest row;
* ``curves.png`` (return, stage times and divergence against env steps; matplotlib) and ``summary.json``
  at the end (written to a temporary file and renamed, so a crash never leaves a half-written summary).

``python -m accerl_jax.plot`` draws several runs from their ``metrics.csv``.
"""
from __future__ import annotations

import collections
import contextlib
import csv
import json
import os
import sys
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.config import ConfigError
from accerl_jax.run_folder import is_run_file

# Wall seconds per stage: the actor's rollout (split into env stepping and policy inference),
# host->device transfer of rollouts, time the learner waits on the rollout queue, the learner update, and
# compression of the actor's policy (of which distillation). Loops add to the stages they have.
STAGES = ("actor", "env", "inference", "transfer", "queue_wait", "learner", "compress", "distill")
# curves.png's stage-time panel: (label, metrics column); a column that stays 0 or is missing is not drawn.
CURVE_STAGES = (("actor", "time_actor_s"), ("learner", "time_learner_s"), ("compress", "time_compress_s"),
                ("fused program (actor + learner + compression)", "time_fused_wait_s"))
TABLE_EVERY = 10  # the console table of the latest row is printed every this many logs (with the progress bar)
# The console table's columns: (row key, header, format); those a run does not log are left out.
TABLE_COLUMNS = (
    ("update", "update", "{:,.0f}"), ("env_steps", "env steps", "{:,.0f}"), ("steps_per_s", "steps/s", "{:,.0f}"),
    ("return_mean", "return", "{:.1f}"), ("length_mean", "length", "{:.0f}"), ("loss", "loss", "{:.3g}"),
    ("grad_norm", "|grad|", "{:.3g}"), ("learning_rate", "lr", "{:.2g}"), ("kl_learner_actor", "KL", "{:.2g}"),
    ("action_agreement", "agree", "{:.1%}"), ("abs_log_rho_mean", "|log ρ|", "{:.2g}"),
    ("rho_beyond_frac", "ρ>1.1ρ̄", "{:.1%}"), ("rho_clipped_mass", "clip mass", "{:.2%}"),
    ("policy_lag_versions", "lag", "{:.0f}"),
)
# What the console's and the summary's abbreviations mean (printed under the first table and the summary).
LEGEND = (
    "KL: KL(π_learner ‖ π_actor) in nats on held-out recent observations (0: the actor acts as the learner); "
    "agree: share of observations where both take the same greedy action; "
    "|log ρ|: mean |log π(a|x) - log μ(a|x)| over the last update's valid steps (ρ = π/μ, π the learner's "
    "policy, μ the compressed actor's that acted); "
    "ρ>1.1ρ̄: share of those ratios more than 10% above the clip ρ̄ (--clip-rho-threshold), i.e. cut by "
    "clipping beyond float noise; clip mass: share of the ratios' total weight Σρ that clipping at ρ̄ removes; "
    "lag: learner updates between the policy that acted and the learner's (--policy-lag, --compress-every)."
)
# What the summary's steps/s mean beside the progress bar's (printed under the summary table).
STEPS_LEGEND = (
    "steps/s: env steps per second of wall time. The summary's: over the whole run (setup, compilation, "
    "training and the final measurements; all seeds' steps with --num-seeds, and per seed). The progress "
    "bar's: the mean since the bar started (compilation included; one seed's steps with --num-seeds), so its "
    "last figure is the higher."
)
# TensorBoard groups (CleanRL-style namespaces): a row key's tag is "<group>/<key>"; keys not listed: "train/".
TENSORBOARD_GROUPS = {
    "charts": ("return_mean", "length_mean", "episodes", "env_steps", "steps_per_s", "wall_time_s"),
    "losses": ("loss", "pg_loss", "value_loss", "entropy", "vs_mean", "grad_norm", "learning_rate", "skipped_updates"),
    "ratios": ("rho_mean", "abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "rho_beyond_frac",
               "rho_clipped_mass"),
    "policy": ("kl_learner_actor", "action_agreement", "policy_lag_versions"),
}
_TAG = {key: f"{group}/{key}" for group, keys in TENSORBOARD_GROUPS.items() for key in keys}


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a row key: ``charts/return_mean``, ``losses/loss``, ``time/learner`` (for
    ``time_learner_s``, seconds), ``ratios/...``, ``policy/...``; already grouped keys (``refresh/kl``) as
    they are; others ``train/<key>``."""
    if "/" in key:
        return key
    if key.startswith("time_") and key.endswith("_s"):
        return f"time/{key[5:-2]}"
    return _TAG.get(key, f"train/{key}")


@jax.jit
def policy_divergence(learner_logits: jax.Array, actor_logits: jax.Array) -> dict:
    """KL(π_learner ‖ π_actor) and greedy-action agreement, means over ``[N, A]`` logits.

    Returns dict of [] float32: ``kl_learner_actor`` (nats) and ``action_agreement`` (fraction).
    """
    log_p = jax.nn.log_softmax(learner_logits)
    log_q = jax.nn.log_softmax(actor_logits)
    kl = jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))
    agree = jnp.mean((jnp.argmax(learner_logits, -1) == jnp.argmax(actor_logits, -1)).astype(jnp.float32))
    return {"kl_learner_actor": kl, "action_agreement": agree}


def gaussian_policy_divergence(learner_out: jax.Array, actor_out: jax.Array) -> dict:
    """The continuous counterpart of :func:`policy_divergence` for diagonal Gaussian policies.

    Args:
      learner_out, actor_out: ``[N, 2D]`` policy outputs (mean then log-std, as
        :class:`accerl_jax.networks.MLPGaussianActorCritic` returns them).

    Returns:
      dict of [] float32: ``kl_learner_actor`` = mean over N of KL(π_learner ‖ π_actor) in nats, closed form
      summed over the D dimensions; ``action_agreement`` = fraction of the N states where the two means are
      within 0.1 learner standard deviations in every dimension (the continuous analogue of equal greedy
      actions).
    """
    m_p, log_s_p = jnp.split(learner_out, 2, axis=-1)
    m_q, log_s_q = jnp.split(actor_out, 2, axis=-1)
    var_p, var_q = jnp.exp(2 * log_s_p), jnp.exp(2 * log_s_q)
    kl = jnp.sum(log_s_q - log_s_p + (var_p + (m_p - m_q) ** 2) / (2 * var_q) - 0.5, axis=-1)
    agree = jnp.all(jnp.abs(m_p - m_q) <= 0.1 * jnp.exp(log_s_p), axis=-1).astype(jnp.float32)
    return {"kl_learner_actor": jnp.mean(kl), "action_agreement": jnp.mean(agree)}


def require_wandb() -> None:
    """Check that Weights & Biases can be imported (before a run asking for it writes anything).

    Raises:
      ConfigError: if ``wandb`` is not installed, saying how to install it.
    """
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("bad --wandb: the wandb package is not installed; pip install wandb (and log in with "
                          "'wandb login', or set WANDB_MODE=offline), or leave out --wandb/--wandb-project") from None


def _finite_or_none(x):
    """Replace non-finite floats (anywhere in nested dicts/lists) by None: strict JSON has no NaN."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def atomic_write(path: str, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``: a reader sees the old file or the
    whole new one, never half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_write_json(path: str, payload: dict) -> None:
    """Write ``payload`` as strict JSON (NaN/inf as null) to ``path`` (:func:`atomic_write`)."""
    atomic_write(path, json.dumps(_finite_or_none(payload), indent=2, sort_keys=True, allow_nan=False))


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
        from tensorboardX import SummaryWriter

        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self.total_steps = total_steps
        self.times = dict.fromkeys(STAGES, 0.0)
        self.returns: collections.deque = collections.deque(maxlen=return_window)
        self.lengths: collections.deque = collections.deque(maxlen=return_window)  # agent steps per episode
        self.episodes = 0
        # Finished episodes whose return is NaN or inf (e.g. an env's NaN reward): counted in ``episodes``
        # and here, never averaged into return_mean / length_mean.
        self.episodes_nonfinite = 0
        self.env_steps = 0
        # --num-seeds > 1: the seeds' own Monitors. This Monitor then summarises them: its steps are one
        # seed's (the x axis every seed shares), its return and length the mean over seeds of each seed's
        # recent mean (never a pool of all seeds' episodes), its episodes the sum.
        self.seeds: list[Monitor] = []
        self.refreshes = 0  # refreshes of the actor's policy logged by log_refresh
        self.start = time.perf_counter()
        # The events file is named after the second it was opened in; the nanoseconds after it keep a session
        # resumed within the same second from overwriting the earlier one's file, and sort after it.
        self._writer = SummaryWriter(logdir, purge_step=purge_step, filename_suffix=f".{time.time_ns()}")
        # metrics.csv was created (claimed) by the loop before the Monitor starts; opened for writing here.
        path = os.path.join(logdir, "metrics.csv")
        self._csv = None
        self.rows: list[dict] = []
        if append and os.path.exists(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.rows = [{k: float(v) if v not in ("", None) else float("nan") for k, v in r.items()} for r in reader]
                fieldnames = reader.fieldnames
            self._csv_file = open(path, "a", newline="")
            if fieldnames:
                self._csv = csv.DictWriter(self._csv_file, fieldnames=fieldnames)
        else:
            self._csv_file = open(path, "w", newline="")
        self._jsonl_file = open(os.path.join(logdir, "metrics.jsonl"), "a" if append else "w")
        self._wandb_kwargs = wandb
        self._wandb = None
        self.wandb_id = uuid.uuid4().hex[:16] if wandb is not None else None
        self.table_every = table_every
        self._logs = 0
        self._progress = None
        if progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.fields[phase]}"),
                BarColumn(),
                TextColumn("{task.completed:>9,}/{task.total:,} steps"),
                TextColumn("{task.fields[sps]:>8,.0f} {task.fields[unit]}"),
                TextColumn("return {task.fields[ret]}"),
                TimeElapsedColumn(),
            )
            self._task = self._progress.add_task("train", total=total_steps, sps=0.0, ret="-", phase="compiling",
                                                 unit="steps/s")
            self._progress.start()

    @contextlib.contextmanager
    def time(self, stage: str):
        """Add the wall seconds of the ``with`` body to ``stage``; the body must block on its outputs."""
        start = time.perf_counter()
        yield
        self.times[stage] += time.perf_counter() - start

    def compressor_stage_time(self, name: str):
        """The ``timer`` for a :func:`~accerl_jax.compressor.chain`'s stages: the ``distill`` stage's seconds
        go to the ``distill`` stage (also counted in ``compress``, the total); other stages are not split."""
        return self.time("distill") if name == "distill" else contextlib.nullcontext()

    def add_time(self, stage: str, seconds: float) -> None:
        self.times[stage] += seconds

    def set_env_time(self, env_seconds: float) -> None:
        """Split the actor time of a fused actor: ``env_seconds`` to env stepping, the rest to inference."""
        self.times["env"] = env_seconds
        self.times["inference"] = self.times["actor"] - env_seconds

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self.start

    def record_episodes(self, episode_return: np.ndarray, finished: np.ndarray, steps: int,
                        episode_length: np.ndarray | None = None) -> None:
        """Add the returns (and lengths, in agent steps) of episodes that finished in a rollout of
        ``steps`` env steps (``[T, B]`` arrays, ``finished`` bool). An episode whose return is not finite
        is counted in ``episodes`` and ``episodes_nonfinite`` but kept out of the returns (and lengths)
        averaged."""
        self.record_steps(steps)
        finished = np.asarray(finished)
        episode_return = np.asarray(episode_return)
        # Time-major order: earlier steps first, so the deque keeps the most recent episodes.
        done_returns = episode_return[finished]
        ok = np.isfinite(done_returns)
        self.returns.extend(done_returns[ok].tolist())
        if episode_length is not None:
            self.lengths.extend(np.asarray(episode_length)[finished][ok].tolist())
        self.episodes += int(done_returns.size)
        self.episodes_nonfinite += int(done_returns.size - np.count_nonzero(ok))

    def record_steps(self, steps: int, episodes: int = 0) -> None:
        """Count ``steps`` env steps and ``episodes`` finished episodes without their returns (a
        Monitor of several seeds: the returns stay with each seed's Monitor)."""
        self.env_steps += steps
        self.episodes += episodes

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
        self.env_steps = int(state["env_steps"])
        self.episodes = int(state["episodes"])
        self.episodes_nonfinite = int(state.get("episodes_nonfinite", 0))  # older checkpoints have none
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.lengths.clear()
        self.lengths.extend(state.get("lengths", []))  # older checkpoints have none
        if self.wandb_id is not None and state.get("wandb_id"):
            self.wandb_id = state["wandb_id"]
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
            return _mean([m.return_mean for m in self.seeds if m.returns])
        return _mean(self.returns)

    @property
    def length_mean(self) -> float:
        """Mean length (agent steps) of the recent finished episodes (of several seeds: as
        :attr:`return_mean`); NaN before the first."""
        if self.seeds:
            return _mean([m.length_mean for m in self.seeds if m.lengths])
        return _mean(self.lengths)

    def log(self, update: int, metrics: dict) -> None:
        """Write one row to every sink (module docstring) and refresh the progress bar.

        ``metrics``: [] scalars (floats or arrays) of the loop, added to the row under their own names.
        """
        wall = self.wall_time
        row = {"update": update, "env_steps": self.env_steps, "wall_time_s": wall,
               "steps_per_s": self.env_steps / max(wall, 1e-9), "return_mean": self.return_mean,
               "length_mean": self.length_mean, "episodes": self.episodes,
               "episodes_nonfinite": self.nonfinite_episodes}
        row.update({f"time_{k}_s": v for k, v in self.times.items()})
        row.update({k: float(v) for k, v in metrics.items()})
        if self._csv is None:
            self._csv = csv.DictWriter(self._csv_file, fieldnames=list(row))
            self._csv.writeheader()
        self._csv.writerow({k: row.get(k, "") for k in self._csv.fieldnames})
        self.rows.append(row)
        self._csv_file.flush()
        self._jsonl_file.write(json.dumps(_finite_or_none(row), allow_nan=False) + "\n")
        self._jsonl_file.flush()
        self._add_scalars({k: v for k, v in row.items() if k != "update"})
        self._log_wandb(row)
        self._logs += 1
        if self._progress is not None and self._logs % self.table_every == 0:
            self._progress.console.print(self.table(row, per_seed=bool(self.seeds)))
            if self._logs == self.table_every:  # the first table: what its abbreviations mean
                self._progress.console.print(LEGEND, style="dim", markup=False, highlight=False)
        self.progress()

    def _log_wandb(self, row: dict) -> None:
        if self._wandb_kwargs is None:
            return
        try:
            if self._wandb is None:
                import wandb

                self._wandb = wandb.init(**{"name": os.path.basename(os.path.normpath(self.logdir)),
                                            **self._wandb_kwargs, "dir": self.logdir, "id": self.wandb_id,
                                            "resume": "allow"})
            # W&B's own step counter, not env steps: a resumed run re-logs updates after its checkpoint, and
            # W&B drops steps lower than one already logged; plot against the env_steps field instead.
            self._wandb.log({k: v for k, v in row.items() if np.isfinite(v)})
        except Exception as err:  # noqa: BLE001 - W&B (login, network) must never stop training
            print(f"warning: Weights & Biases failed ({type(err).__name__}: {err}); W&B logging is off for the rest "
                  f"of this run; metrics.csv, metrics.jsonl and TensorBoard in {self.logdir} are complete",
                  file=sys.stderr)
            self._wandb_kwargs, self._wandb = None, None

    @staticmethod
    def table(row: dict, per_line: int = 3, per_seed: bool = False):
        """A compact rich Table of one logged ``row``: the :data:`TABLE_COLUMNS` it has, as ``per_line``
        name/value pairs per line (fits 80 columns); NaN shown as '-'. ``per_seed``: the row is a Monitor of
        several seeds' (its env steps and steps/s are one seed's; headers say so)."""
        from rich.table import Table

        per = {"env_steps": "env steps/seed", "steps_per_s": "steps/s/seed"} if per_seed else {}
        cells = [(per.get(k, header), fmt.format(row[k]) if np.isfinite(row[k]) else "-")
                 for k, header, fmt in TABLE_COLUMNS if k in row and k != "update"]
        table = Table(title=f"update {row['update']:,.0f}", show_header=False, box=None, pad_edge=False,
                      title_justify="left")
        for _ in range(per_line):
            table.add_column(style="bold")
            table.add_column(justify="right")
        for i in range(0, len(cells), per_line):
            line = [x for cell in cells[i:i + per_line] for x in cell]
            table.add_row(*line, *[""] * (2 * per_line - len(line)))
        return table

    def log_refresh(self, update: int, divergence: dict) -> None:
        """Log KL(π_learner ‖ π_actor) and agreement at a refresh of the actor's policy (TensorBoard,
        ``refresh/<name>``, against env steps); ``divergence`` as from :func:`policy_divergence`."""
        self.refreshes += 1
        self._add_scalars({**{f"refresh/{k}": v for k, v in divergence.items()}, "refresh/update": update})

    def _add_scalars(self, values: dict) -> None:
        """TensorBoard: the finite ``values`` (tag -> scalar) as one event at the current env steps. The same
        records as one ``add_scalar`` per tag (one ``Summary.Value`` each), but one ``Summary`` proto for
        all of them: far less host time, which the Anakin loop's chunks otherwise share the CPU with."""
        from tensorboardX.proto.summary_pb2 import Summary

        tags = [Summary.Value(tag=tensorboard_tag(k), simple_value=float(v)) for k, v in values.items() if np.isfinite(v)]
        self._writer._get_file_writer().add_summary(Summary(value=tags), self.env_steps)

    def log_decision(self, decision: dict) -> None:
        """Record a ``--compressor auto`` decision (:mod:`accerl_jax.compressor.auto`): one JSON line in
        ``decisions.jsonl`` (with ``env_steps`` and ``wall_time_s`` added), a console line, TensorBoard text
        ``auto/decision`` and scalars ``auto/chosen_index``, ``auto/switched``, ``auto/chosen_kl`` and
        ``auto/chosen_speedup_vs_none`` (against env steps)."""
        line = dict(decision, env_steps=self.env_steps, wall_time_s=self.wall_time)
        with open(os.path.join(self.logdir, "decisions.jsonl"), "a") as f:
            f.write(json.dumps(_finite_or_none(line), sort_keys=True) + "\n")
        verb = "switched to" if decision["switched"] else "kept"
        text = f"auto, update {decision['update']}: {verb} {decision['chosen']} [{decision['trigger']}] {decision['reason']}"
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)
        chosen = decision["candidates"][decision["chosen"]]
        self._writer.add_text("auto/decision", text, self.env_steps)
        self._writer.add_scalar("auto/chosen_index", decision["chosen_index"], self.env_steps)
        self._writer.add_scalar("auto/switched", float(decision["switched"]), self.env_steps)
        self._writer.add_scalar("auto/chosen_kl", chosen["kl"], self.env_steps)
        self._writer.add_scalar("auto/chosen_speedup_vs_none", chosen["speedup_vs_none"], self.env_steps)

    def progress(self) -> None:
        if self._progress is not None:
            ret = f"{self.return_mean:.1f}" if self.has_returns else "-"
            phase = f"train x{len(self.seeds)} seeds" if self.seeds else "train"  # steps per seed, mean return
            # The mean rate since the bar started (compilation included), of one seed's steps with --num-seeds.
            self._progress.update(self._task, completed=self.env_steps, phase=phase,
                                  sps=self.env_steps / max(self.wall_time, 1e-9), ret=ret,
                                  unit="steps/s/seed" if self.seeds else "steps/s")

    def close(self) -> None:
        """Stop the progress bar and close the log files (safe to call twice)."""
        if self._csv_file.closed:
            return
        if self._progress is not None:
            self.progress()
            self._progress.stop()
            self._progress = None
        self._writer.close()
        self._csv_file.close()
        self._jsonl_file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def plot(self, title: str) -> str | None:
        """Write ``curves.png`` from the logged rows; returns its path (None if nothing was logged)."""
        if not self.rows:
            return None
        # A Figure of its own, without pyplot (whose import and teardown would add to every run's end;
        # savefig renders with the Agg canvas either way).
        from matplotlib.figure import Figure
        from matplotlib.ticker import EngFormatter

        steps = [r["env_steps"] for r in self.rows]
        fig = Figure(figsize=(15, 4))
        axes = fig.subplots(1, 3)
        axes[0].plot(steps, [r["return_mean"] for r in self.rows])
        axes[0].set(title="episode return (recent mean)", xlabel="env steps")
        # The stages this loop times apart; the Anakin loop's one fused program is timed as a whole.
        for label, key in CURVE_STAGES:
            values = [r.get(key, float("nan")) for r in self.rows]
            if any(v > 0 for v in values):  # NaN compares False
                axes[1].plot(steps, values, label=label)
        axes[1].set(title="cumulative stage time (s)", xlabel="env steps")
        if axes[1].get_legend_handles_labels()[0]:
            axes[1].legend()
        if "kl_learner_actor" in self.rows[0]:
            axes[2].plot(steps, [r["kl_learner_actor"] for r in self.rows])
            axes[2].set_yscale("symlog", linthresh=1e-6)
        axes[2].set(title="KL(π_learner ‖ π_actor)", xlabel="env steps")
        for ax in axes:
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, not 200000: labels that do not collide
        fig.suptitle(title)
        # Fixed margins: tight_layout measures every tick label first, about half the plot's time.
        fig.subplots_adjust(left=0.05, right=0.98, bottom=0.14, top=0.84, wspace=0.22)
        path = os.path.join(self.logdir, "curves.png")
        fig.savefig(path, dpi=80)
        return path

    def discard(self) -> None:
        """Remove the files this Monitor created (for a run stopped before its first update)."""
        for name in os.listdir(self.logdir):
            if is_run_file(name):
                os.remove(os.path.join(self.logdir, name))
        if not os.listdir(self.logdir):
            os.rmdir(self.logdir)

    def write_summary(self, summary: dict) -> None:
        """Write ``summary.json`` atomically."""
        atomic_write_json(os.path.join(self.logdir, "summary.json"), summary)


def print_summary(summary: dict) -> None:
    """Print the end-of-run summary table (rich)."""
    from rich.console import Console
    from rich.table import Table

    wall = summary["wall_time_s"]
    where = (f"  loop={summary['loop']} on {summary.get('learner_devices', '?')} {summary.get('backend', '?')} device(s)"
             if "loop" in summary else "")
    resumed = (f"  resumed from update {summary['resumed_from_update']:,}"
               if summary.get("resumed_from_update") is not None else "")
    loss = f"  loss={summary['loss']}" if "loss" in summary else ""
    table = Table(title=f"accerl_jax: {summary['env']}  compressor={summary['compressor']}  "
                        f"corrector={summary['corrector']}{loss}{where}{resumed}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("share of wall", justify="right")

    def share(x):
        return f"{100 * x / wall:.0f}%" if wall > 0 else ""

    def seconds(x):  # a stage that took time never reads "0.0 s"
        return f"{x:.1f} s" if x >= 1 or x == 0 else f"{x:.3g} s"

    ret, seeds = summary["final_return_mean"], summary.get("num_seeds", 1)
    if summary.get("stopped"):
        table.add_row("[bold red]stopped early", summary["stopped"], "")
    window = f"last {summary['returns_averaged']} episodes"
    table.add_row(
        f"final return (mean over {seeds} seeds of each one's {window})" if seeds > 1 else f"final return (mean of {window})",
        "no episode finished" if ret is None else f"{ret:.1f}",
        "",
    )
    if seeds > 1 and ret is not None:
        per_seed = [r for r in summary["final_return_mean_per_seed"] if r is not None]
        table.add_row("  per seed: min / max", f"{min(per_seed):.1f} / {max(per_seed):.1f}", "")
    table.add_row("episodes finished" + (" (all seeds)" if seeds > 1 else ""), f"{summary['episodes']:,}", "")
    if summary.get("episodes_nonfinite"):
        table.add_row("  with a non-finite return (not averaged)", f"{summary['episodes_nonfinite']:,}", "")
    if summary.get("final_length_mean") is not None:
        table.add_row("episode length (same episodes, mean)", f"{summary['final_length_mean']:.1f} steps", "")
    if seeds > 1:
        table.add_row("env steps per seed / all seeds", f"{summary['env_steps_per_seed']:,} / {summary['total_env_steps']:,}", "")
    else:
        table.add_row("env steps", f"{summary['total_env_steps']:,}", "")
    # Three rates a user sees differ: the progress bar's (mean since the bar started, per seed), and these,
    # over the whole run's wall time (setup, compilation, training and the final measurements).
    if seeds > 1:
        per_seed_rate = summary.get("steps_per_s_per_seed", summary["steps_per_s"] / seeds)
        table.add_row(f"steps/s, all {seeds} seeds (whole run incl. compile)", f"{summary['steps_per_s']:,.0f}", "")
        table.add_row("  per seed (the progress bar's steps)", f"{per_seed_rate:,.0f}", "")
    else:
        table.add_row("steps/s (whole run incl. compile)", f"{summary['steps_per_s']:,.0f}", "")
    table.add_row("wall time (incl. compile)", f"{wall:.1f} s", "100%")
    if summary.get("startup_s") is not None:
        table.add_row("start-up: process start to first update (imports, setup, compile)",
                      f"{summary['startup_s']:.1f} s", "")
        table.add_row("  of which before training (interpreter, imports, parsing)",
                      f"{summary['startup_before_train_s']:.1f} s", "")
    if "compile_cache" in summary:
        hits, misses = summary["compile_cache_hits"], summary["compile_cache_misses"]
        table.add_row("compile cache (--compile-cache)", "off" if summary["compile_cache"] is None else
                      f"{hits} of {hits + misses} programs loaded", "")
    split = summary.get("cost_split") or {}
    if summary.get("loop") == "anakin":  # one fused program: its stages are not timed apart while training
        fused = summary["fused_wait_s"]
        table.add_row("fused program (actor+learner+compression)", seconds(fused), share(fused))
    else:
        table.add_row("actor time", seconds(summary["actor_time_s"]), share(summary["actor_time_s"]))
        table.add_row(f"  env stepping ({summary['env_time_source']})", seconds(summary["env_time_s"]),
                      share(summary["env_time_s"]))
        table.add_row("  policy inference", seconds(summary["inference_time_s"]), share(summary["inference_time_s"]))
        table.add_row("learner time", seconds(summary["learner_time_s"]), share(summary["learner_time_s"]))
        table.add_row("compression time", seconds(summary["compress_time_s"]), share(summary["compress_time_s"]))
        if summary.get("distill_time_s"):
            table.add_row("  of which distillation", seconds(summary["distill_time_s"]), share(summary["distill_time_s"]))
    if split.get("timed"):  # measured after training, each compiled piece alone (accerl_jax.loops.pieces)
        ms = lambda k: f"{1e3 * split[k]:.2f}"  # noqa: E731
        table.add_row("per update, pieces timed alone: actor (uncompressed) / learner / compression",
                      f"{ms('actor_s_per_update')} ({ms('uncompressed_actor_s_per_update')}) / "
                      f"{ms('learner_s_per_update')} / {ms('compress_s_per_update')} ms", "")
        table.add_row("timed: actor share / ceiling of actor compression / this compressor's saving",
                      f"{100 * split['actor_share']:.0f}% / {100 * split['ceiling']:.0f}% / "
                      f"{100 * split['predicted_saving']:.0f}%", "")
    if split.get("flops"):  # XLA's cost analysis of each piece (no compile)
        f = split["flops"]
        mf = lambda k: f"{f[k] / 1e6:.3g}"  # noqa: E731
        table.add_row("per update, FLOPs (XLA cost analysis): actor (uncompressed) / learner / compression",
                      f"{mf('actor_flops_per_update')} ({mf('uncompressed_actor_flops_per_update')}) / "
                      f"{mf('learner_flops_per_update')} / {mf('compress_flops_per_update')} MFLOP", "")
        table.add_row("FLOPs: actor share / ceiling of actor compression / this compressor's saving",
                      f"{100 * f['actor_share']:.0f}% / {100 * f['ceiling']:.0f}% / {100 * f['predicted_saving']:.0f}%",
                      "")
    speedup = summary["actor_policy_speedup"]
    table.add_row(
        f"actor policy forward speed vs uncompressed (B={summary['forward_batch']})",
        "not measured (interrupted)" if speedup is None else f"{speedup:.2f}x",
        "",
    )
    kl, agree = summary["kl_learner_actor"], summary["action_agreement"]
    table.add_row(
        "KL(π_learner ‖ π_actor), nats / greedy agreement",
        "n/a" if kl is None or agree is None or not np.isfinite(kl) else f"{kl:.3g} / {100 * agree:.1f}%",
        "",
    )
    if summary.get("abs_log_rho_mean") is not None:
        table.add_row(
            "importance ratios ρ = π/μ (last update): mean |log ρ| / ρ > 1.1·ρ̄ / clipped mass",
            f"{summary['abs_log_rho_mean']:.3g} / {100 * summary['rho_beyond_frac']:.1f}% / "
            f"{100 * summary['rho_clipped_mass']:.2f}%",
            "",
        )
    console = Console()
    console.print(table)
    console.print(LEGEND + " " + STEPS_LEGEND, style="dim", markup=False, highlight=False)
