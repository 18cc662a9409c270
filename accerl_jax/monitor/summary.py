"""The end-of-run summary: ``summary.json`` (written whole or not at all) and the text printed at the end.

The printed summary opens with its verdict in words (the return reached, the training-only rate, what the
compressor did and why), then a compact table, then its notes once. Every line fits 80 columns, so a
log piped to a file (as on a cluster) has no wrapped row.

:func:`training_rate` and :func:`fidelity` read the logged rows (``metrics.csv``) of a run: the rate
between its first and last row (compilation excluded), and the actor's fidelity during training (KL,
agreement, lag) rather than only after the final re-sync.
"""
from __future__ import annotations

import dataclasses
import math
import os
import textwrap

from accerl_jax.monitor.files import atomic_write_json

WIDTH = 80  # the printed summary's width in columns (a terminal's default, and rich's for a file)
LABEL = 15  # width of the table's label column
# What the summary's rates mean (printed once, under the table).
STEPS_LEGEND = (
    "steps/s: env steps (agent steps summed over envs) per second. 'training only': between the first and "
    "the last logged row of this session, so compilation and start-up are excluded (the rate PureJaxRL "
    "users quote); 'whole run': over the whole wall time (start-up, compilation, training and the final "
    "measurements; all seeds' steps with --num-seeds)."
)
FIDELITY_LEGEND = (
    "KL: KL(π_learner ‖ π_actor) in nats on held-out recent observations; agree: share of those where both "
    "take the same greedy action; lag: learner updates between the policy that acted and the learner's. "
    "'during training': mean and worst over the logged rows; 'at the end': after the final re-sync."
)
OVERLAP_NOTE = "Stages run in threads at the same time (Sebulba): their shares overlap and may add up past 100%."


@dataclasses.dataclass(frozen=True, kw_only=True)
class Summary:
    """A run's summary: the one place that defines the fields of ``summary.json`` (README, "Outputs"),
    built by :func:`accerl_jax.run.driver.summarize`; :meth:`to_json` is what is written and returned.

    Units: seconds (``*_s``), env steps (agent steps summed over envs), nats (KL). Stage times (``*_time_s``)
    are every session's (a resumed run's included); ``steps_per_s`` is over the whole run's wall time
    (``steps_per_s_scope`` says what it counts), the ``training_*`` rate between this session's first and
    last logged row (:func:`training_rate`).
    """

    # The run's settings (--loss auto resolved: accerl_jax.run.plan.make_loss_config).
    env: str
    compressor: str
    corrector: str
    loss: str
    epochs: int
    minibatches: int
    policy_lag: int
    seed: int
    num_envs: int
    rollout_length: int
    # How it ended.
    updates: int  # learner updates completed (every session's)
    stopped: str | None  # None (the budget), "interrupted" or "diverged"
    stop_reason: str | None
    exit_signal: str | None  # the signal's name ("SIGINT") when stopped == "interrupted"
    skipped_updates: int  # --on-nan skip (--num-seeds: the sum over seeds in the run's own summary)
    resumed_from_update: int | None
    last_checkpoint: str | None
    checkpoint_time_s: float
    # Steps and time.
    total_env_steps: int  # --num-seeds: every seed's in the run's own summary
    wall_time_s: float
    actor_time_s: float
    env_time_s: float
    env_time_source: str
    inference_time_s: float
    learner_time_s: float
    compress_time_s: float
    distill_time_s: float
    # Returns (over the last return_window finished episodes; None: no episode finished).
    final_return_mean: float | None
    final_length_mean: float | None
    return_window: int
    returns_averaged: int
    episodes: int
    episodes_nonfinite: int  # finished with a NaN/inf return, not averaged
    # Rates: steps_per_s over the whole wall time, steps_per_s_per_seed one seed's, what they count.
    steps_per_s: float
    steps_per_s_per_seed: float
    steps_per_s_scope: str
    training_steps_per_s: float | None  # training_rate(): compilation and start-up left out
    training_s: float | None
    training_env_steps: int | None
    # The actor's fidelity over the logged rows (fidelity()): KL, agreement, lag, mean and worst.
    kl_during_mean: float | None
    kl_during_max: float | None
    agreement_during_mean: float | None
    agreement_during_min: float | None
    lag_during_mean: float | None
    lag_during_max: float | None
    # Networks and the final parameters.
    learner_network: dict  # accerl_jax.networks.NetworkSpec as a dict
    learner_params: int  # parameter count
    actor_params: int
    actor_param_bytes: int
    # The last update's metrics: KL(π_learner ‖ π_actor), greedy agreement, the importance ratios π/μ
    # (mean |log ρ|, fractions with ρ > ρ̄, ρ > c̄ and ρ > ρ̄ · CLIP_MARGIN, the share of Σρ that clipping at
    # ρ̄ removes) and the learning rate; None where the update does not report it.
    kl_learner_actor: float | None
    action_agreement: float | None
    abs_log_rho_mean: float | None
    rho_clipped_frac: float | None
    c_clipped_frac: float | None
    rho_beyond_frac: float | None
    rho_clipped_mass: float | None
    learning_rate: float | None
    # Where it ran.
    devices: int
    num_processes: int
    process_id: int
    learner_devices: int
    learner_batch: int
    learner_params_digest: str
    actor_params_digest: str
    backend: str
    logdir: str | None
    config: dict  # the Config as a dict (--num-seeds' per-seed summary: that seed's --seed)
    # The actor's policy speed (accerl_jax.platform.speed.policy_speedup; None when the run stopped early) and the
    # per-update cost split (accerl_jax.loops.pieces.cost_split; None where not measured).
    actor_policy_speedup: float | None
    base_forward_s: float | None
    actor_forward_s: float | None
    forward_batch: int
    cost_split: dict | None
    # This session's start-up (accerl_jax.run.driver.STARTUP_SCOPE) and its compilation cache.
    startup_s: float | None
    startup_before_train_s: float
    startup_scope: str
    compile_cache: str | None
    compile_cache_hits: int
    compile_cache_misses: int
    # Only where they apply (left out of to_json() when None): the XLA configurations the policy speed
    # was measured in; --num-seeds > 1 in the run's own summary: one seed's env steps, each seed's final
    # return and each seed's own summary (without config and learner_network).
    base_config: str | None = None
    actor_config: str | None = None
    env_steps_per_seed: int | None = None
    final_return_mean_per_seed: list | None = None
    seeds: list | None = None
    # --agent search only (accerl_jax.search.fidelity.summary_fields): the policy target (--search-target),
    # network evaluations per env step (S + 1, actor side; and the learner's with --learner-children) and the
    # compressed search's agreement with,
    # and total-variation distance from, the learner's search over the logged rows (mean and worst) and at the last row.
    search_target: str | None = None
    network_evaluations_per_step: int | None = None
    learner_evaluations_per_step: int | None = None  # --learner-children: the learner's network at the root's children
    search_agreement_during_mean: float | None = None
    search_agreement_during_min: float | None = None
    search_agreement: float | None = None
    search_tv_during_mean: float | None = None
    search_tv_during_max: float | None = None
    search_tv: float | None = None
    # --compressor auto's cost-split gate (accerl_jax.run.auto_gate.record): the ceiling counted before
    # training, the threshold, what auto resolved to (compressor then names it) and why, in words.
    auto_gate: dict | None = None
    # The loop's own fields (accerl_jax.run.driver.Stepper.fields: "loop", its waits, --compressor auto's
    # decisions, ...), added last (a loop may restate env_time_source).
    loop_fields: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        """The summary as written to ``summary.json`` (a fresh dict; JSON types)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            # The fields declared with a default of None apply only to some runs: left out while unset.
            if f.name == "loop_fields" or (f.default is None and value is None):
                continue
            out[f.name] = value
        out.update(self.loop_fields)
        return out


def write_summary(logdir: str, summary: dict) -> None:
    """Write ``<logdir>/summary.json`` atomically (strict JSON: NaN and inf as null)."""
    atomic_write_json(os.path.join(logdir, "summary.json"), summary)


def finite_values(rows: list[dict], key: str) -> list[float]:
    """The finite values of ``key`` in ``rows``, in order (rows without it, or with NaN/inf or a
    non-number there, are skipped)."""
    values = []
    for r in rows:
        try:
            v = float(r.get(key, math.nan))
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            values.append(v)
    return values


def training_rate(rows: list[dict], since_update: int = 0) -> dict:
    """The training-only rate of the logged ``rows`` after update ``since_update`` (a resumed session's
    start): env steps per second between the first and the last such row, so compilation and start-up
    (all before the first row) are excluded.

    Args:
      rows: logged rows (``metrics.csv``'s), each with ``update``, ``env_steps`` and ``wall_time_s``
        (seconds since the run started).
      since_update: rows at or before this update belong to an earlier session and are left out.

    Returns:
      ``{"training_steps_per_s", "training_s", "training_env_steps"}``; the rate is None where fewer than
      two rows with distinct wall times exist (e.g. a run whose whole budget was one fused chunk).
    """
    own = [r for r in rows if float(r.get("update", 0)) > since_update]
    if len(own) < 2:
        return {"training_steps_per_s": None, "training_s": None, "training_env_steps": None}
    first, last = own[0], own[-1]
    seconds = float(last["wall_time_s"]) - float(first["wall_time_s"])
    steps = int(float(last["env_steps"]) - float(first["env_steps"]))
    rate = steps / seconds if seconds > 0 and steps > 0 else None
    return {"training_steps_per_s": rate, "training_s": seconds if rate else None,
            "training_env_steps": steps if rate else None}


def fidelity(rows: list[dict]) -> dict:
    """The compressed actor's fidelity during training, from the logged ``rows``: mean and worst of
    ``kl_learner_actor`` (nats; worst = largest), ``action_agreement`` (fraction; worst = smallest) and
    ``policy_lag_versions`` (learner updates; worst = largest). A quantity no row logged (or only as NaN)
    is None.

    Returns:
      ``{"kl_during_mean", "kl_during_max", "agreement_during_mean", "agreement_during_min",
      "lag_during_mean", "lag_during_max"}``.
    """
    return mean_and_worst(rows, (("kl_learner_actor", "kl", max), ("action_agreement", "agreement", min),
                                 ("policy_lag_versions", "lag", max)))


def mean_and_worst(rows: list[dict], quantities) -> dict:
    """Mean and worst over the logged ``rows`` of each ``(row key, name, worst)`` in ``quantities``
    (``worst``: ``min`` or ``max``): ``{"<name>_during_mean", "<name>_during_<min|max>"}``, over the rows'
    finite values; None for a quantity no row logged (or only as NaN/inf)."""
    out = {}
    for key, name, worst in quantities:
        values = finite_values(rows, key)
        out[f"{name}_during_mean"] = sum(values) / len(values) if values else None
        out[f"{name}_during_{worst.__name__}"] = worst(values) if values else None
    return out


def _seconds(x: float) -> str:  # a stage that took time never reads "0.0 s"
    return f"{x:.1f} s" if x >= 1 or x == 0 else f"{x:.3g} s"


def _pct(x: float) -> str:  # one decimal below 10%, so a 0.4% share does not read "0%"
    return f"{100 * x:.1f}%" if abs(x) < 0.1 else f"{100 * x:.0f}%"


def _learner_evaluations(summary: dict) -> str:
    """The console's note on the learner network's evaluations per env step (``--learner-children``), or ""."""
    n = summary.get("learner_evaluations_per_step")
    return f" and {n} of the learner's (the roots' children)" if n else ""


def _kl(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{max(x, 0.0):.3g}"


def verdict(summary: dict) -> list[str]:
    """The summary's opening sentences (plain text, unwrapped): the return reached and when, the rate,
    and what the compressor did with the cost split's numbers."""
    seeds = summary.get("num_seeds", 1)
    ret = summary["final_return_mean"]
    steps = summary["env_steps_per_seed"] if seeds > 1 else summary["total_env_steps"]
    runs = "runs (--sweep)" if (summary.get("config") or {}).get("sweep") else "seeds"
    of = f"mean over {seeds} {runs} of each one's last {summary['returns_averaged']} episodes" if seeds > 1 \
        else f"mean of the last {summary['returns_averaged']} episodes"
    lines = []
    if summary.get("stopped"):
        lines.append(f"STOPPED EARLY ({summary['stopped']}): {summary.get('stop_reason') or 'see above'}.")
    lines.append("No episode finished." if ret is None else
                 f"Return {ret:.1f} ({of}) after {steps:,} env steps{' per seed' if seeds > 1 else ''}.")
    rate, wall = summary.get("training_steps_per_s"), summary["wall_time_s"]
    whole = f"whole run {wall:.1f} s at {summary['steps_per_s']:,.0f} steps/s"
    per = " per seed" if seeds > 1 else ""
    lines.append(f"Training ran at {rate:,.0f} env steps/s{per} (training only); {whole}." if rate else
                 f"Whole run {wall:.1f} s at {summary['steps_per_s']:,.0f} env steps/s (too short to time "
                 "training alone).")
    lines.append(_compressor_verdict(summary))
    return lines


def _compressor_verdict(summary: dict) -> str:
    gate = summary.get("auto_gate") or {}
    if gate.get("outcome") == "none":  # the gate's sentence says it all (the actor's share included)
        return f"Compressor {gate['reason']}."
    said = f"Compressor {gate['reason']}. " if gate else ""
    return said + _fixed_verdict(summary)


def _fixed_verdict(summary: dict) -> str:
    name = summary["compressor"]
    split = summary.get("cost_split") or {}
    if "actor_share" not in split:
        return (f"Compressor {name}: the cost split was not measured (interrupted, or the loop's pieces "
                "cannot be timed apart).")
    unit = "by FLOPs" if split.get("ceiling_source") == "flops" else "timed"
    share = (f"the actor is {_pct(split['actor_share'])} of an update ({unit}), so no compressor can "
             f"save more than {_pct(split['ceiling'])} of it here")
    if name == "none":
        return f"Compressor none: actors run the learner's own policy; {share}."
    speedup = summary.get("actor_policy_speedup")
    faster = "" if speedup is None else f"its policy runs {speedup:.2f}x the uncompressed speed, but " \
        if speedup > 1 else f"its policy runs {speedup:.2f}x the uncompressed speed (no faster); "
    saving = split["predicted_saving"]
    net = (f"it saves {_pct(saving)} of an update" if saving > 0.005 else
           f"it costs {_pct(-saving)} of an update (compression included)" if saving < -0.005 else
           "it saves nothing measurable")
    return f"Compressor {name}: {faster}{share}; {net}."


def _sweep_rows(summary: dict) -> list[tuple[str, str]]:
    """A ``--sweep`` run's rows: each combination of values, with the mean over its seeds of their final
    returns (each seed's own summary has the rest); none without a sweep."""
    combos: dict = {}
    for run in summary.get("seeds") or []:
        if "swept" in run:
            label = ", ".join(f"{k} {v:g}" for k, v in run["swept"].items())
            combos.setdefault(label, []).append(run.get("final_return_mean"))
    rows = []
    for label, returns in combos.items():
        done = [r for r in returns if r is not None]
        ret = f"return {sum(done) / len(done):.1f}" if done else "no episode finished"
        rows.append(("sweep" if not rows else "", f"{label}: {ret} ({len(returns)} seed{'s' * (len(returns) > 1)})"))
    return rows


def _rows(summary: dict) -> list[tuple[str, str]]:
    """The compact table: (label, value) pairs."""
    rows: list[tuple[str, str]] = []
    seeds = summary.get("num_seeds", 1)
    ep = f"{summary['episodes']:,}" + (" (all seeds)" if seeds > 1 else "")
    if summary.get("episodes_nonfinite"):
        ep += f", {summary['episodes_nonfinite']:,} non-finite (not averaged)"
    rows.append(("episodes", ep))
    if summary.get("final_length_mean") is not None:
        rows.append(("episode length", f"{summary['final_length_mean']:.1f} steps (mean, same episodes)"))
    if seeds > 1:
        per = [r for r in summary.get("final_return_mean_per_seed", []) if r is not None]
        if per:
            rows.append(("return per seed", f"min {min(per):.1f}, max {max(per):.1f}"))
        rows.extend(_sweep_rows(summary))
        rows.append(("env steps", f"{summary['env_steps_per_seed']:,} per seed, {summary['total_env_steps']:,} all"))
    else:
        rows.append(("env steps", f"{summary['total_env_steps']:,} in {summary.get('updates', 0):,} updates"))
    rate = summary.get("training_steps_per_s")
    if seeds > 1:  # the logged rows count one seed's steps
        per_seed = summary.get("steps_per_s_per_seed", summary["steps_per_s"] / seeds)
        rows.append(("steps/s", (f"{rate:,.0f} per seed training only; " if rate else "")
                     + f"whole run {summary['steps_per_s']:,.0f} all {seeds} seeds, {per_seed:,.0f} per seed"))
    else:
        rows.append(("steps/s", (f"{rate:,.0f} training only, " if rate else "")
                     + f"{summary['steps_per_s']:,.0f} whole run"))
    wall = summary["wall_time_s"]
    rows.append(("wall time", f"{wall:.1f} s" + (f"; first update done {summary['startup_s']:.1f} s after the "
                                                  "process started" if summary.get("startup_s") is not None else "")))
    if "compile_cache" in summary:
        hits, misses = summary["compile_cache_hits"], summary["compile_cache_misses"]
        rows.append(("compile cache", "off" if summary["compile_cache"] is None else
                     f"{hits} of {hits + misses} programs loaded"))
    share = lambda x: f" ({_pct(x / wall)})" if wall > 0 else ""  # noqa: E731
    if summary.get("loop") == "anakin":  # one fused program: its stages are not timed apart while training
        rows.append(("fused program", _seconds(summary["fused_wait_s"]) + share(summary["fused_wait_s"])
                     + ": actor, learner, compression"))
    elif "actor_time_s" in summary:
        rows.append(("actor", _seconds(summary["actor_time_s"]) + share(summary["actor_time_s"])
                     + f": env {_seconds(summary['env_time_s'])}, policy {_seconds(summary['inference_time_s'])}"))
        rows.append(("learner", _seconds(summary["learner_time_s"]) + share(summary["learner_time_s"])))
        comp = _seconds(summary["compress_time_s"]) + share(summary["compress_time_s"])
        if summary.get("distill_time_s"):
            comp += f", distillation {_seconds(summary['distill_time_s'])}"
        rows.append(("compression", comp))
    split = summary.get("cost_split") or {}
    if split.get("timed"):
        ms = lambda k: f"{1e3 * split[k]:.2g}"  # noqa: E731
        rows.append(("ms/update", f"actor {ms('actor_s_per_update')} (uncompressed "
                                   f"{ms('uncompressed_actor_s_per_update')}), learner {ms('learner_s_per_update')}, "
                                   f"compress {ms('compress_s_per_update')}"))
    if split.get("flops"):
        f = split["flops"]
        mf = lambda k: f"{f[k] / 1e6:.3g}"  # noqa: E731
        rows.append(("MFLOP/update", f"actor {mf('actor_flops_per_update')} (uncompressed "
                                     f"{mf('uncompressed_actor_flops_per_update')}), learner "
                                     f"{mf('learner_flops_per_update')}, compress {mf('compress_flops_per_update')}"))
    if "actor_share" in split:
        rows.append(("actor share", f"{_pct(split['actor_share'])} of an update, ceiling {_pct(split['ceiling'])}, "
                                    f"saving {_pct(split['predicted_saving'])}"))
    speedup = summary.get("actor_policy_speedup")
    rows.append(("actor speed", "not measured (interrupted)" if speedup is None else
                 f"{speedup:.2f}x uncompressed (forward, B={summary['forward_batch']})"))
    if summary.get("kl_during_mean") is not None:
        during = f"KL {_kl(summary['kl_during_mean'])} mean, {_kl(summary['kl_during_max'])} worst"
        if summary.get("agreement_during_mean") is not None:
            during += (f"; agree {100 * summary['agreement_during_mean']:.1f}% mean, "
                       f"{100 * summary['agreement_during_min']:.1f}% worst")
        rows.append(("during training", during))
    if summary.get("lag_during_mean") is not None:
        rows.append(("policy lag", f"{summary['lag_during_mean']:.2g} updates mean, "
                                   f"{summary['lag_during_max']:.0f} worst (during training)"))
    kl, agree = summary["kl_learner_actor"], summary["action_agreement"]
    rows.append(("at the end", "KL n/a" if kl is None or agree is None or not math.isfinite(kl) else
                 f"KL {_kl(kl)} nats, agree {100 * agree:.1f}% (after the final re-sync)"))
    if summary.get("search_agreement_during_mean") is not None:  # --agent search (accerl_jax.search.fidelity)
        rows.append(("search vs learner's", f"agree {100 * summary['search_agreement_during_mean']:.1f}% mean, "
                     f"{100 * summary['search_agreement_during_min']:.1f}% worst; TV "
                     f"{summary['search_tv_during_mean']:.3g} mean, {summary['search_tv_during_max']:.3g} worst; "
                     f"{summary['network_evaluations_per_step']} network evaluations per env step"
                     f"{_learner_evaluations(summary)}; "
                     f"policy target: {summary.get('search_target', 'search')}"))
    # A search run applies no correction (corrector None): its μ is the search's policy, not a behaviour
    # policy to correct for, so the ratios would only mislead.
    if summary.get("abs_log_rho_mean") is not None and summary.get("corrector") is not None:
        rows.append(("ratios ρ = π/μ", f"mean |log ρ| {summary['abs_log_rho_mean']:.3g}, "
                                       f"{100 * summary['rho_beyond_frac']:.1f}% above 1.1·ρ̄, "
                                       f"clipped mass {100 * summary['rho_clipped_mass']:.2f}% (last update)"))
    return rows


def format_summary(summary: dict, width: int = WIDTH) -> str:
    """The printed summary as text of at most ``width`` columns: a title line, the :func:`verdict`, the
    compact table (one label column, values wrapped under themselves) and the notes, each once."""
    where = (f"{summary['loop']} loop on {summary.get('learner_devices', '?')} {summary.get('backend', '?')} "
             f"device(s)" if "loop" in summary else "")
    loss = f"{summary['loss']}, " if "loss" in summary else ""
    # A search run's corrector is None: it trains on the search's own targets (accerl_jax.search.targets).
    corrector = summary["corrector"] or "none (search targets)"
    title = f"accerl_jax summary: {summary['env']}, {loss}corrector {corrector}"
    if where:
        title += f", {where}"
    if summary.get("resumed_from_update") is not None:
        title += f", resumed from update {summary['resumed_from_update']:,}"
    out = textwrap.wrap(title, width)
    out.append("=" * min(width, max(len(line) for line in out)))
    for sentence in verdict(summary):
        out += textwrap.wrap(sentence, width)
    out.append("")
    indent = " " * (LABEL + 2)
    for label, value in _rows(summary):
        out += textwrap.wrap(value, width, initial_indent=f"{label:<{LABEL}}  ", subsequent_indent=indent)
    out.append("")
    notes = [STEPS_LEGEND, FIDELITY_LEGEND]
    if summary.get("loop") == "sebulba":
        notes.append(OVERLAP_NOTE)
    for note in notes:
        out += textwrap.wrap(note, width)
    return "\n".join(out)


def print_summary(summary: dict, width: int = WIDTH) -> None:
    """Print :func:`format_summary` (stdout)."""
    print(format_summary(summary, width), flush=True)
