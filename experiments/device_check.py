"""One script for a machine with a GPU: the numbers that need an accelerator, in one JSON.

Three parts, each a subprocess with its own time limit (a slow or hung part is stopped and recorded as
``timed_out``; the others still run), the JSON rewritten after each part so partial results survive:

1. ``main_job``: ``python -m accerl_jax.train`` with its defaults (the README's main job) on the GPU:
   process wall seconds, the summary's ``wall_time_s``, ``final_return_mean``, ``steps_per_s``, loop,
   backend, and the first logged wall time at which the mean return reached :data:`TARGET_RETURN`.
2. ``actor_time``: ``experiments/actor_time.py`` on ``gymnax:CartPole-v1`` with ``none``, ``int8``,
   ``bf16`` and ``distill:small`` (the actor-time table, the policy on the GPU).
3. ``sebulba``: ``experiments/actor_bound.py`` (Sebulba on envpool Pong-v5, the actor's policy on the
   host CPU, the learner on the GPU) for ``none``, ``prune:0.5``, ``distill:tiny`` and ``int8``: the
   best one's training throughput against ``none`` beside its actor inference speedup.

The JSON also holds the JAX version, the devices (probed in a subprocess, so this process never holds
the GPU), the 1-minute load average before and after each part (``os.getloadavg``), the git revision
and the exact commands. ``--device gpu`` (the default) stops with exit code 2 and a one-line message if
JAX sees no GPU. ``--quick`` runs every part with tiny sizes on the CPU (a smoke test, seconds per part).

Usage:
  python experiments/device_check.py [--out experiments/results/gpu/device_check.json]
  python experiments/device_check.py --device cpu --quick --out /tmp/device_check.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
TARGET_RETURN = 475.0  # CartPole-v1's solved threshold, the main job's target (README)
BUDGETS_S = {"main_job": 120, "actor_time": 150, "sebulba": 160}  # under 8 minutes in all, with start-ups
QUICK_BUDGETS_S = {"main_job": 60, "actor_time": 60, "sebulba": 90}
SEBULBA_START_SHARE = 0.6
PROBE = ("import json, jax; print('DEVICES ' + json.dumps({'jax': jax.__version__, 'backend': jax.default_backend(), "
         "'devices': [str(d) for d in jax.devices()], 'cpu_devices': [str(d) for d in jax.devices('cpu')]}))")


def part_commands(device: str, quick: bool, folder: str, budgets: dict) -> dict:
    """``name -> (argv, output file or folder)`` of each part; outputs go under ``folder``. The Sebulba
    part starts no new training run after :data:`SEBULBA_START_SHARE` of its budget (its inference
    timing and JSON still fit)."""
    main_dir = os.path.join(folder, "main_job")
    main = [PY, "-m", "accerl_jax.train", "--logdir", main_dir, "--no-progress"]
    actor = [PY, os.path.join(HERE, "actor_time.py"), "--env", "gymnax:CartPole-v1",
             "--methods", "none,int8,bf16,distill:small", "--out", os.path.join(folder, "actor_time.json")]
    sebulba = [PY, os.path.join(HERE, "actor_bound.py"), "--device", device,
               "--out", os.path.join(folder, "sebulba.json"), "--budget-s", str(SEBULBA_START_SHARE * budgets["sebulba"])]
    if quick:
        main += ["--total-steps", "1024", "--num-envs", "8", "--log-every", "2"]
        actor += ["--num-envs", "8", "--train-steps", "512", "--train-envs", "8", "--distill-steps", "50",
                  "--fit-rollouts", "1", "--fit-samples", "64", "--held-samples", "64", "--rollout-length", "4",
                  "--rounds", "1", "--repeats", "1"]
        sebulba += ["--quick", "--compressors", "none", "int8", "--updates", "5"]
    else:
        actor += ["--num-envs", "1024", "--train-steps", "400000", "--distill-steps", "1000", "--rounds", "3",
                  "--repeats", "3"]
        sebulba += ["--repeats", "1", "--compressors", "none", "prune:0.5", "distill:tiny", "int8"]
    return {"main_job": (main, main_dir), "actor_time": (actor, os.path.join(folder, "actor_time.json")),
            "sebulba": (sebulba, os.path.join(folder, "sebulba.json"))}


def child_env(device: str) -> dict:
    """The parts' environment: JAX on the CPU only for ``cpu``; for ``gpu`` every platform (the actor
    needs the host CPU's too) and no up-front GPU memory grab, so the parts never starve each other."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    if device == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env.pop("JAX_PLATFORMS", None)
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def probe_devices(env: dict) -> dict:
    """JAX's version, backend and devices as a subprocess with ``env`` sees them."""
    proc = subprocess.run([PY, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("DEVICES ")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1][len("DEVICES "):])


def main_job_result(logdir: str) -> dict:
    """The main job's summary numbers and the first logged wall time with mean return >= TARGET_RETURN."""
    import csv

    with open(os.path.join(logdir, "summary.json")) as f:
        s = json.load(f)
    reached = None
    with open(os.path.join(logdir, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            value = row.get("return_mean")
            if value not in (None, "", "nan") and float(value) >= TARGET_RETURN:
                reached = float(row["wall_time_s"])
                break
    keep = ("loop", "backend", "compressor", "wall_time_s", "final_return_mean", "steps_per_s", "total_env_steps",
            "updates", "learner_devices", "stopped")
    return {**{k: s.get(k) for k in keep}, "time_to_target_s": reached, "target_return": TARGET_RETURN}


def run_part(name: str, argv: list, output: str, budget_s: float, env: dict, log: str) -> dict:
    """Run one part with a ``budget_s`` second limit (then its process group is killed), its output in
    ``log``; its results (or why there are none) as a dict."""
    record = {"command": argv, "budget_s": budget_s, "load_average_1min_before": os.getloadavg()[0],
              "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            record.update(returncode=proc.wait(timeout=budget_s), timed_out=False)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            record.update(returncode=None, timed_out=True)
    with open(log, errors="replace") as f:
        record["output_tail"] = f.read()[-1500:]
    record.update(wall_s=time.perf_counter() - start, load_average_1min_after=os.getloadavg()[0])
    try:
        if name == "main_job":
            record["result"] = main_job_result(output)
        else:
            with open(output) as f:
                record["result"] = json.load(f)
    except (OSError, ValueError) as err:
        record["result"] = None
        record["error"] = f"no result: {type(err).__name__}: {err}"
    return record


def write_json(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file, then ``os.replace``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def git_revision() -> str:
    """``git describe --always --dirty`` of the repository, or ``"unknown"``."""
    try:
        return subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=30).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every part")
    p.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "gpu", "device_check.json"))
    p.add_argument("--parts", nargs="+", choices=tuple(BUDGETS_S), default=list(BUDGETS_S))
    for name in BUDGETS_S:
        p.add_argument(f"--budget-{name.replace('_', '-')}", type=float, default=None, metavar="S",
                       help=f"seconds for the {name} part (default {BUDGETS_S[name]}; --quick {QUICK_BUDGETS_S[name]})")
    args = p.parse_args(argv)
    env = child_env(args.device)
    devices = probe_devices(env)
    if args.device == "gpu" and devices.get("backend") != "gpu":
        print(f"device_check: --device gpu, but JAX sees no GPU (backend {devices.get('backend')!r}, devices "
              f"{devices.get('devices', devices.get('error'))}); run on a machine with an NVIDIA GPU and "
              "jax[cuda12], or use --device cpu --quick for the CPU smoke run", file=sys.stderr)
        sys.exit(2)
    budgets = QUICK_BUDGETS_S if args.quick else BUDGETS_S
    out = {"device": args.device, "quick": args.quick, "git_revision": git_revision(), **devices,
           "machine": platform.machine(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
           "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "parts": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    start = time.perf_counter()
    budgets = {name: getattr(args, f"budget_{name}") or budgets[name] for name in budgets}
    with tempfile.TemporaryDirectory() as folder:
        commands = part_commands(args.device, args.quick, folder, budgets)
        for name in args.parts:
            argv_, output = commands[name]
            out["parts"][name] = run_part(name, argv_, output, budgets[name], env, os.path.join(folder, f"{name}.log"))
            out["wall_s"] = time.perf_counter() - start
            write_json(args.out, out)  # partial results survive a later part's failure
            part = out["parts"][name]
            print(f"{name}: {'timed out' if part['timed_out'] else 'exit ' + str(part['returncode'])} after "
                  f"{part['wall_s']:.0f} s" + (f" ({part['error']})" if "error" in part else ""), flush=True)
    print(f"wrote {args.out} ({out['wall_s']:.0f} s)")
    return out


if __name__ == "__main__":
    main()
