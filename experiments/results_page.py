"""The two runs of ``experiments/measure_all.py`` side by side, as one markdown page.

Reads ``DIR/run1/`` and ``DIR/run2/`` (the JSON each script wrote) and ``DIR/measure_all.json`` (argv, wall
seconds and 1-minute load averages of each command), and writes ``DIR/README.md``: for every table, each
figure from run 1 and run 2 next to each other ("a / b"), so a reader sees how far the same command moved
between two runs on the same code. Nothing is measured here.

    python experiments/results_page.py experiments/results/cpu-2core
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def pair(a, b, fmt: str, unit: str = "") -> str:
    """``"a / b"`` in ``fmt`` (``—`` for a missing value); one value when both print the same."""
    def one(x):
        return "—" if x is None else format(x, fmt) + unit
    sa, sb = one(a), one(b)
    return sa if sa == sb else f"{sa} / {sb}"


def commands(manifest: dict) -> list[str]:
    """One line per command of the manifest: name, run, wall seconds, load before/after, exit code."""
    lines = ["| table | run | git | started (UTC) | wall s | 1-min load before → after | exit |",
             "| --- | --- | --- | --- | ---: | --- | ---: |"]
    for c in manifest.get("commands", []):
        lines.append(f"| {c['name']} | {c['run']} | {c.get('git_rev', '?')[:7]} | {c['start_utc']} | {c.get('wall_s', '—')} | "
                     f"{c['load_1min_before']:.1f} → {c.get('load_1min_after', float('nan')):.1f} | "
                     f"{c.get('returncode', '—')} |")
    return lines


def actor_time(a: dict, b: dict) -> list[str]:
    lines = [f"### Actor time: {a['env']}, {a['num_envs']} envs", "",
             f"Ceiling (random actions, no policy): {pair(a['ceiling_sps'], b['ceiling_sps'], ',.0f')} steps/s. "
             "Steps/s is the fastest of the interleaved timed rollouts; the speedup is against `none` in its "
             "fastest XLA configuration, measured in the same process.", "",
             "| method | steps/s | speedup vs `none` | KL(π‖μ) nats | greedy agreement | params | bytes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in sorted(a["methods"], key=lambda m: m != "none"):  # the baseline first
        r, s = a["methods"][m], b["methods"].get(m, {})
        lines.append(f"| `{m}` | {pair(r['sps'], s.get('sps'), ',.0f')} | "
                     f"{pair(r['speedup_vs_none'], s.get('speedup_vs_none'), '.2f', 'x')} | "
                     f"{pair(r['kl'], s.get('kl'), '.4f')} | {pair(100 * r['agreement'], 100 * s['agreement'] if s else None, '.1f', '%')} | "
                     f"{r['params']:,} | {r['bytes']:,} |")
    return lines + [""]


def training(a: dict, b: dict) -> list[str]:
    reached = lambda r: f"{r['reached']}/{r['seeds']}"  # noqa: E731
    final = lambda r: f"{r['final_return_mean']:.1f} ± {r['final_return_std']:.1f}"  # noqa: E731
    lines = ["### Training time to a target (compilation included)", "",
             "Median over 3 seeds of the wall time to the first logged update whose mean return over the last 100 "
             "episodes reaches the target; reduction against `none` in the same run (positive: faster than `none`).", "",
             "| env (target, budget) | method | seeds reaching target | time to target s | reduction | final return (mean ± std) | wall time at budget s |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for env, t in a["training"].items():
        u = b["training"][env]
        first = True
        for m in sorted(t["methods"], key=lambda m: m != "none"):
            r, s = t["methods"][m], u["methods"][m]
            head = f"{t['env']} ({t['target']:g}, {t['steps']:,} steps)" if first else ""
            first = False
            lines.append(
                f"| {head} | `{m}` | {pair(reached(r), reached(s), '')} | "
                f"{pair(r['time_to_target_median_s'], s['time_to_target_median_s'], '.1f')} | "
                f"{pair(r['time_to_target_reduction_pct'], s['time_to_target_reduction_pct'], '+.1f', '%')} | "
                f"{pair(final(r), final(s), '')} | "
                f"{pair(r['wall_time_mean_s'], s['wall_time_mean_s'], '.1f')} |")
    return lines + [""]


def solve(a: dict, b: dict) -> list[str]:
    lines = [f"### The default run (`{a['command'].strip()}`), per seed", "",
             "| seed | final return | training wall time s | whole process s | steps/s (whole run) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for r, s in zip(a["runs"], b["runs"]):
        lines.append(f"| {r['seed']} | {pair(r['final_return_mean'], s['final_return_mean'], '.1f')} | "
                     f"{pair(r['wall_time_s'], s['wall_time_s'], '.1f')} | "
                     f"{pair(r['process_time_s'], s['process_time_s'], '.1f')} | "
                     f"{pair(r['steps_per_s'], s['steps_per_s'], ',.0f')} |")
    return lines + [""]


def throughput(a: dict, b: dict) -> list[str]:
    ca, cb = a["core"], b["core"]
    lines = [f"### Training throughput: {a['env']}, {a['updates']} updates per run, median of {a['repeats']}", "",
             "`bare` is one jitted rollout+update function in a Python loop (no logging, no Monitor): the ceiling a "
             "loop can reach.", "",
             "| loop | compressor | steps/s | final return |", "| --- | --- | ---: | ---: |"]
    for k, r in ca["runs"].items():
        s = cb["runs"].get(k, {})
        loop, comp = k.split("|")
        lines.append(f"| {loop} | `{comp}` | {pair(r['steps_per_s'], s.get('steps_per_s'), ',.0f')} | "
                     f"{pair(r.get('final_return_mean'), s.get('final_return_mean'), '.1f')} |")
    lines += ["", "| compressor | Anakin overhead vs bare | Anakin speedup vs sequential |", "| --- | ---: | ---: |"]
    for comp, r in ca["ratios"].items():
        s = cb["ratios"][comp]
        lines.append(f"| `{comp}` | {pair(100 * r['anakin_overhead_vs_bare'], 100 * s['anakin_overhead_vs_bare'], '.1f', '%')} | "
                     f"{pair(r['anakin_speedup_vs_sequential'], s['anakin_speedup_vs_sequential'], '.2f', 'x')} |")
    return lines + [""]


def export_sizes(a: dict, b: dict) -> list[str]:
    lines = ["### Exported policy sizes (`python -m accerl_jax.export`'s program)", "",
             "| env | compressor | parameters | parameter bytes | program bytes | program / learner's |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r, s in zip(a["rows"], b["rows"]):
        lines.append(f"| {r['env']} | `{r['compressor']}` | {r['param_count']:,} | {r['param_bytes']:,} | "
                     f"{pair(r['program_bytes'], s['program_bytes'], ',')} | "
                     f"{pair(r['program_vs_learner'], s['program_vs_learner'], '.3f')} |")
    return lines + [""]


def corrector(a: dict, b: dict) -> list[str]:
    lines = [f"### Correctors with a heavily compressed (`{a['compressor']}`), {a['policy_lag']}-update-stale actor", "",
             "| env | corrector | final return per seed | KL(π‖μ) at end, per seed |", "| --- | --- | --- | --- |"]
    for env, by_corr in a["runs"].items():
        for corr, rs in by_corr.items():
            ss = b["runs"].get(env, {}).get(corr, [])
            ret = ", ".join(pair(r["final_return_mean"], s["final_return_mean"], ".1f") for r, s in zip(rs, ss))
            kl = ", ".join(pair(r["kl_learner_actor"], s["kl_learner_actor"], ".3f") for r, s in zip(rs, ss))
            lines.append(f"| {env} | {corr} | {ret} | {kl} |")
    return lines + [""]


def sebulba(a: dict, b: dict) -> list[str]:
    o = a["options"]
    lines = [f"### Sebulba against the sequential loop: {o['env']}, {o['num_envs']} envs × {o['rollout_length']} steps, "
             f"{o['updates']} updates, median of {o['repeats']}", "",
             "Steady env steps/s (compilation excluded).", "", "| loop / compressor | steps/s |", "| --- | ---: |"]
    for k, v in a["median"].items():
        lines.append(f"| {k} | {pair(v, b['median'].get(k), ',.0f')} |")
    lines += ["", "| compressor | fastest Sebulba / sequential |", "| --- | ---: |"]
    lines += [f"| `{c}` | {pair(v, b['sebulba_speedup'].get(c), '.2f', 'x')} |" for c, v in a["sebulba_speedup"].items()]
    return lines + [""]


def distill_overlap(a: dict, b: dict) -> list[str]:
    lines = [f"### Asynchronous distillation: {a['env']}, `{a['compressor']}`, {a['total_steps']:,} steps, median over seeds",
             "", "| mode | wall time s | final return |", "| --- | ---: | ---: |"]
    for mode, r in a["median"].items():
        s = b["median"][mode]
        lines.append(f"| {mode} | {pair(r['wall_time_s'], s['wall_time_s'], '.1f')} | "
                     f"{pair(r['final_return_mean'], s['final_return_mean'], '.1f')} |")
    return lines + ["", f"Async / sync wall-time speedup: {pair(a['async_wall_speedup'], b['async_wall_speedup'], '.2f', 'x')}.", ""]


def actor_bound(a: dict, b: dict) -> list[str]:
    o = a["options"]
    lines = [f"### The actor-bound Sebulba setting: {a['env']}, {o['num_envs']} envs × {o['rollout_length']} steps, "
             f"actor on cpu:0, median of {o['repeats']}", "",
             "| compressor | steady steps/s | throughput vs none | inference speedup | KL |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for c, r in a["methods"].items():
        s = b["methods"].get(c, {})
        lines.append(f"| `{c}` | {pair(r['steady_steps_per_s'], s.get('steady_steps_per_s'), ',.0f')} | "
                     f"{pair(r['throughput_ratio'], s.get('throughput_ratio'), '.2f', 'x')} | "
                     f"{pair(r['inference_speedup'], s.get('inference_speedup'), '.2f', 'x')} | "
                     f"{pair(r['kl_learner_actor'], s.get('kl_learner_actor'), '.4f')} |")
    return lines + [""]


TABLES = (  # (file in each run folder, section writer)
    ("actor_time_cartpole.json", actor_time),
    ("actor_time_breakout_minatar.json", actor_time),
    ("paper_tables_classic/paper_tables.json", training),
    ("paper_tables_minatar/paper_tables.json", training),
    ("solve_cartpole.json", solve),
    ("throughput_cpu.json", throughput),
    ("export_sizes.json", export_sizes),
    ("corrector_ablation.json", corrector),
    ("throughput_sebulba_cpu.json", sebulba),
    ("distill_overlap.json", distill_overlap),
    ("actor_bound.json", actor_bound),
)


def page(folder: str) -> str:
    manifest = _load(os.path.join(folder, "measure_all.json")) or {}
    lines = ["# Measured on this machine: two runs of every table", "",
             f"Written by `python experiments/results_page.py {folder}` from the two runs of "
             f"`python experiments/measure_all.py --out {folder}` (each command's git revision is in the list at the end; "
             f"{manifest.get('machine', {}).get('cpus', '?')} CPU cores). Each cell shows run 1 / run 2 (one value "
             "when both print the same).", ""]
    for name, write in TABLES:
        a, b = _load(os.path.join(folder, "run1", name)), _load(os.path.join(folder, "run2", name))
        if a is not None and b is not None:
            lines += write(a, b)
    lines += ["## The commands, their wall time and the machine's load", ""] + commands(manifest) + [""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the --out folder of measure_all.py (with run1/, run2/, measure_all.json)")
    args = p.parse_args()
    if not os.path.isdir(os.path.join(args.folder, "run1")):
        p.error(f"{args.folder!r} has no run1/ folder; give measure_all.py's --out folder")
    text = page(args.folder)
    with open(os.path.join(args.folder, "README.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
