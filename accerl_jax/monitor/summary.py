"""The end-of-run summary: ``summary.json`` (written whole or not at all) and the table printed at the end."""
from __future__ import annotations

import os

import numpy as np

from accerl_jax.monitor.console import LEGEND
from accerl_jax.monitor.files import atomic_write_json

# What the summary's steps/s mean beside the progress bar's (printed under the summary table).
STEPS_LEGEND = (
    "steps/s: env steps per second of wall time. The summary's: over the whole run (setup, compilation, "
    "training and the final measurements; all seeds' steps with --num-seeds, and per seed). The progress "
    "bar's: the mean since the bar started (compilation included; one seed's steps with --num-seeds), so its "
    "last figure is the higher."
)


def write_summary(logdir: str, summary: dict) -> None:
    """Write ``<logdir>/summary.json`` atomically (strict JSON: NaN and inf as null)."""
    atomic_write_json(os.path.join(logdir, "summary.json"), summary)


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
