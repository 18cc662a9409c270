"""The main job's whole process on two checkouts of accerl_jax, side by side: what a change did to start-up.

Each checkout is ``LABEL=PYTHON:FOLDER``: ``PYTHON -m accerl_jax.train`` runs in ``FOLDER`` (so it imports
that folder's ``accerl_jax``) with the packages of ``PYTHON``'s environment (so a change of pinned
versions is compared too). Per seed, the checkouts take turns (their order rotates), each with a first
run on an empty compilation cache (``cold``: a first run on a machine, or after a change of flags) and
the same command again on the cache it filled (``warm``).

Recorded per process (:func:`peer_purejaxrl.run_ours`): the whole process's seconds (interpreter start to
exit, as a user waits), the summary's start-up (process start to the end of the first chunk of updates)
and the part of it before the training call (interpreter, imports), the seconds from process start to
the first logged mean return >= 475, and the final return. Medians per checkout and kind; ratios B / A.

Usage: python experiments/startup_ab.py --a old=/venv-old/bin/python:/tmp/old --b new=.venv/bin/python:.
       [--seeds 0 1 2] [--flags "..."] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_purejaxrl import _median, run_ours  # noqa: E402  (one whole process of the main job; medians)
from throughput_sebulba import write_outputs  # noqa: E402

KEYS = ("process_s", "startup_s", "startup_before_train_s", "time_to_target_s")


def checkout(spec: str) -> tuple[str, str, str]:
    """``LABEL=PYTHON:FOLDER`` -> ``(label, python, folder)`` with absolute paths."""
    label, sep, rest = spec.partition("=")
    python, sep2, folder = rest.partition(":")
    if not (sep and sep2 and label and python and folder):
        raise SystemExit(f"bad checkout {spec!r}; expected LABEL=PYTHON:FOLDER, e.g. new=.venv/bin/python:.")
    python = python if os.sep not in python else os.path.abspath(python)
    return label, python, os.path.abspath(folder)


def to_markdown(result: dict) -> str:
    a, b = result["labels"]
    lines = [f"# The main job on two checkouts ({result['host']}, {result['cpu_count']} CPUs, seeds {result['seeds']}, "
             f"flags: {result['flags'] or 'none'}; medians)", "",
             "| checkout | run | whole process s | start-up s | of which before training s | to 475 from process start s "
             "| final returns |", "|---|---|---:|---:|---:|---:|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for kind in ("cold", "warm"):
        for label in (a, b):
            c = result["configs"][f"{label}, {kind}"]
            rets = ", ".join("-" if r["final_return"] is None else f"{r['final_return']:.0f}" for r in c["runs"])
            lines.append(f"| {label} | {kind} | " + " | ".join(fmt(c[k]) for k in KEYS) + f" | {rets} |")
    lines += ["", f"| run | {b} / {a}: whole process | start-up | before training | to 475 |", "|---|---:|---:|---:|---:|"]
    for kind in ("cold", "warm"):
        ca, cb = result["configs"][f"{a}, {kind}"], result["configs"][f"{b}, {kind}"]
        ratio = lambda k: "-" if not ca[k] or cb[k] is None else f"{cb[k] / ca[k]:.2f}"  # noqa: E731
        lines.append(f"| {kind} | " + " | ".join(ratio(k) for k in KEYS) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="the first checkout, LABEL=PYTHON:FOLDER")
    p.add_argument("--b", required=True, help="the second checkout, LABEL=PYTHON:FOLDER")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--flags", default="", help="flags added to the main job's command line")
    p.add_argument("--out", default=None, help="write the results as JSON here (and a .md table beside it)")
    args = p.parse_args(argv)
    checkouts = [checkout(args.a), checkout(args.b)]
    if checkouts[0][0] == checkouts[1][0]:
        raise SystemExit(f"the two checkouts need different labels, got {checkouts[0][0]!r} twice")
    runs: dict[str, list] = {f"{c[0]}, {kind}": [] for c in checkouts for kind in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        for n, seed in enumerate(args.seeds):
            for label, python, folder in checkouts[n % 2:] + checkouts[:n % 2]:  # the order rotates per seed
                cache = tempfile.mkdtemp(dir=tmp, prefix="xla-")  # empty: a first run on this machine
                for kind in ("cold", "warm"):
                    run = run_ours(seed, shlex.split(args.flags), cache, tmp, python=python, cwd=folder)
                    runs[f"{label}, {kind}"].append(dict(seed=seed, **run))
                    print(f"{label}, {kind}", runs[f"{label}, {kind}"][-1], flush=True)
                shutil.rmtree(cache)
    result = {"host": platform.node(), "cpu_count": os.cpu_count(), "seeds": args.seeds, "flags": args.flags,
              "labels": [c[0] for c in checkouts], "checkouts": {c[0]: {"python": c[1], "folder": c[2]} for c in checkouts},
              "command": "python experiments/startup_ab.py " + " ".join(argv or sys.argv[1:]),
              "configs": {name: dict({k: _median(r, k) for k in KEYS}, runs=r) for name, r in runs.items()}}
    md = to_markdown(result)
    print(md)
    if args.out:
        write_outputs(args.out, result, md)
    return result


if __name__ == "__main__":
    main()
