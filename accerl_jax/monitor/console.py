"""The console: a rich progress bar and, every ``table_every`` logs, a compact table of the latest row."""
from __future__ import annotations

import numpy as np

TABLE_EVERY = 10  # the console table of the latest row is printed every this many logs (with the progress bar)
# The console table's columns: (row key, header, format); those a run does not log are left out.
TABLE_COLUMNS = (
    ("update", "update", "{:,.0f}"), ("env_steps", "env steps", "{:,.0f}"), ("steps_per_s", "steps/s", "{:,.0f}"),
    ("return_mean", "return", "{:.1f}"), ("length_mean", "length", "{:.0f}"), ("loss", "loss", "{:.3g}"),
    ("grad_norm", "|grad|", "{:.3g}"), ("learning_rate", "lr", "{:.2g}"), ("kl_learner_actor", "KL", "{:.2g}"),
    ("action_agreement", "agree", "{:.1%}"), ("abs_log_rho_mean", "|log ρ|", "{:.2g}"),
    ("rho_beyond_frac", "ρ>1.1ρ̄", "{:.1%}"), ("rho_clipped_mass", "clip mass", "{:.2%}"),
    ("policy_lag_versions", "lag", "{:.0f}"), ("search_agreement", "search agree", "{:.1%}"),
    ("search_tv", "search TV", "{:.2g}"),
)
# What the console's and the summary's abbreviations mean (printed under the first table and the summary).
LEGEND = (
    "KL: KL(π_learner ‖ π_actor) in nats on held-out recent observations (0: the actor acts as the learner); "
    "agree: share of observations where both take the same greedy action; "
    "|log ρ|: mean |log π(a|x) - log μ(a|x)| over the last update's valid steps (ρ = π/μ, π the learner's "
    "policy, μ the compressed actor's that acted); "
    "ρ>1.1ρ̄: share of those ratios more than 10% above the clip ρ̄ (--clip-rho-threshold), i.e. cut by "
    "clipping beyond float noise; clip mass: share of the ratios' total weight Σρ that clipping at ρ̄ removes; "
    "lag: learner updates between the policy that acted and the learner's (--policy-lag, --compress-every); "
    "search agree / TV (--agent search): share of held states where the actor's compressed search and the "
    "learner's (same key) pick the same move, and the total variation between their action weights."
)


def table(row: dict, per_line: int = 3, per: str | None = None):
    """A compact rich Table of one logged ``row``: the :data:`TABLE_COLUMNS` it has, as ``per_line``
    name/value pairs per line (fits 80 columns); NaN shown as '-'. ``per`` (``"seed"`` for --num-seeds,
    ``"run"`` for --sweep): the row is a Monitor of several replicas' (its env steps and steps/s are one
    replica's; headers say so)."""
    from rich.table import Table

    per = {"env_steps": f"env steps/{per}", "steps_per_s": f"steps/s/{per}"} if per else {}
    cells = [(per.get(k, header), fmt.format(row[k]) if np.isfinite(row[k]) else "-")
             for k, header, fmt in TABLE_COLUMNS if k in row and k != "update"]
    out = Table(title=f"update {row['update']:,.0f}", show_header=False, box=None, pad_edge=False,
                title_justify="left")
    for _ in range(per_line):
        out.add_column(style="bold")
        out.add_column(justify="right")
    for i in range(0, len(cells), per_line):
        line = [x for cell in cells[i:i + per_line] for x in cell]
        out.add_row(*line, *[""] * (2 * per_line - len(line)))
    return out


class ConsoleSink:
    """The progress bar (over ``total_steps`` env steps; only with ``progress``) and the table of every
    ``table_every``-th row written (with the :data:`LEGEND` under the first)."""

    def __init__(self, total_steps: int, progress: bool = True, table_every: int = TABLE_EVERY):
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

    @property
    def active(self) -> bool:
        """Whether the progress bar is shown."""
        return self._progress is not None

    def write(self, row: dict, per: str | None = None) -> None:
        """Count a logged row; every ``table_every``-th is printed as a :func:`table`."""
        self._logs += 1
        if self._progress is not None and self._logs % self.table_every == 0:
            self._progress.console.print(table(row, per=per))
            if self._logs == self.table_every:  # the first table: what its abbreviations mean
                self._progress.console.print(LEGEND, style="dim", markup=False, highlight=False)

    def print(self, text: str) -> None:
        """A plain line above the progress bar (or on stdout without it)."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def update(self, **fields) -> None:
        """Move the progress bar: ``completed`` env steps and its fields (``phase``, ``sps``, ``ret``,
        ``unit``)."""
        if self._progress is not None:
            self._progress.update(self._task, **fields)

    def close(self) -> None:
        """Stop the progress bar (safe to call twice)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
