"""``curves.png``: return, stage times and divergence against env steps (matplotlib), from the logged rows.

``python -m accerl_jax.plot`` draws several runs from their ``metrics.csv``.
"""
from __future__ import annotations

# curves.png's stage-time panel: (label, metrics column); a column that stays 0 or is missing is not drawn.
CURVE_STAGES = (("actor", "time_actor_s"), ("learner", "time_learner_s"), ("compress", "time_compress_s"),
                ("fused program (actor + learner + compression)", "time_fused_wait_s"))


def plot_curves(rows: list[dict], title: str, path: str) -> str | None:
    """Write the curves of the logged ``rows`` to ``path`` (a PNG); returns ``path`` (None for no rows)."""
    if not rows:
        return None
    curves_figure(rows, title).savefig(path, dpi=80)
    return path


def curves_figure(rows: list[dict], title: str):
    """The matplotlib ``Figure`` of ``curves.png`` for the logged ``rows`` (at least one): return, stage
    times and KL(π_learner ‖ π_actor) against env steps."""
    # A Figure of its own, without pyplot (whose import and teardown would add to every run's end;
    # savefig renders with the Agg canvas either way).
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    steps = [r["env_steps"] for r in rows]
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    axes[0].plot(steps, [r["return_mean"] for r in rows])
    axes[0].set(title="episode return (recent mean)", xlabel="env steps")
    # The stages this loop times apart; the Anakin loop's one fused program is timed as a whole.
    for label, key in CURVE_STAGES:
        values = [r.get(key, float("nan")) for r in rows]
        if any(v > 0 for v in values):  # NaN compares False
            axes[1].plot(steps, values, label=label)
    axes[1].set(title="cumulative stage time (s)", xlabel="env steps")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend()
    if "kl_learner_actor" in rows[0]:
        # At least 0 (as accerl_jax.plot draws it): float32 rounding can put the KL of two equal policies a
        # few 1e-9 below 0, which symlog would draw with negative ticks.
        axes[2].plot(steps, [max(r["kl_learner_actor"], 0.0) for r in rows])  # NaN stays NaN
        axes[2].set_yscale("symlog", linthresh=1e-6)
        axes[2].set_ylim(bottom=0.0)
    axes[2].set(title="KL(π_learner ‖ π_actor)", xlabel="env steps")
    for ax in axes:
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, not 200000: labels that do not collide
    fig.suptitle(title)
    # Fixed margins: tight_layout measures every tick label first, about half the plot's time.
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.14, top=0.84, wspace=0.22)
    return fig
