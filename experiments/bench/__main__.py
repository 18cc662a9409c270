"""``python -m experiments.bench``: list the benchmarks, run one or all, generate the results page.

    python -m experiments.bench list
    python -m experiments.bench run NAME|all [--quick] [--repeats N] [--out DIR]
                                 [--purejaxrl CHECKOUT --peer-python VENV/bin/python]
                                 [--stoix CHECKOUT --stoix-python VENV/bin/python]
    python -m experiments.bench page [--results DIR] [--write docs/RESULTS.md]

``run`` writes ``DIR/<name>.json`` (default ``experiments/results/<machine kind>/``; with ``--quick``,
a folder under the system's temporary directory, so a smoke run never replaces a measurement). A
benchmark that names its ``host_devices`` runs in a process of its own with that many CPU devices
(:func:`own_process`) where this one has another count. Bad input: one line on stderr, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from experiments.bench import harness, kinds, page
from experiments.bench.manifest import BENCHMARKS, BY_NAME

RESULTS = os.path.join(harness.REPO, "experiments", "results")


class ChildError(RuntimeError):
    """A benchmark's own process (:func:`own_process`) exited with an error."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def _flag(args, flag: str):
    """The parsed value of ``flag`` (``--peer-python`` -> ``args.peer_python``)."""
    return getattr(args, flag.lstrip("-").replace("-", "_"))


def _folder_problem(path: str) -> str | None:
    """Why ``path`` cannot be a folder this process writes, or None. The folder is made here if missing (before
    any run, so that no run's result is lost to a bad ``--out`` after hours of training)."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "a file; expected a folder (made if missing)"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        return f"cannot make that folder ({err.strerror})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not a writable folder"
    return None


def parse(argv):
    p = Parser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("list", help="the manifest: name, kind, what it measures")
    run = sub.add_parser("run", help="run benchmarks and write their JSON")
    run.add_argument("name", help="a benchmark name (see list) or 'all'")
    run.add_argument("--quick", action="store_true", help="each benchmark's smoke budget (seconds; not a measurement)")
    run.add_argument("--repeats", type=int, default=None, help="rotated rounds of every configuration (default: the manifest's)")
    run.add_argument("--seeds", default=None, help="comma-separated seeds replacing the manifest's (e.g. 0 or 0,1)")
    run.add_argument("--keep-runs", default=None, metavar="DIR",
                     help="keep each training run's folder under DIR: running the same command again reads back the "
                          "finished runs and resumes the stopped ones from their latest checkpoint (training and "
                          "compression benchmarks)")
    run.add_argument("--out", default=None, help="results folder (default: experiments/results/<machine kind>/)")
    run.add_argument("--purejaxrl", default=None, help="a checkout of luchris429/purejaxrl (the peer)")
    run.add_argument("--peer-python", default=None, help="the Python of PureJaxRL's own virtual environment")
    run.add_argument("--stoix", default=None, help="a checkout of EdanToledo/Stoix (search_vs_stoix's peer)")
    run.add_argument("--stoix-python", default=None, help="the Python of Stoix's own virtual environment")
    pg = sub.add_parser("page", help="the results page from the JSON")
    pg.add_argument("--results", default=RESULTS, help="folder of one results folder per machine")
    pg.add_argument("--write", default=None, help="a page to regenerate below its marker line (else: print)")
    args = p.parse_args(argv)
    if args.command == "run":
        if args.name != "all" and args.name not in BY_NAME:
            p.error(f"bad benchmark {args.name!r}; expected 'all' or one of {', '.join(BY_NAME)}")
        if args.seeds is not None:
            try:
                args.seeds = [int(x) for x in args.seeds.split(",")]
            except ValueError:
                args.seeds = None
            if not args.seeds or min(args.seeds) < 0 or len(set(args.seeds)) < len(args.seeds):
                p.error("bad --seeds; expected distinct non-negative integers separated by commas, e.g. 0,1,2")
        if args.keep_runs is not None:
            kept = [b for b in (BENCHMARKS if args.name == "all" else [BY_NAME[args.name]]) if b.kind in kinds.KEEPS_RUNS]
            if not kept:
                p.error(f"bad --keep-runs with {args.name}: a {BY_NAME[args.name].kind} benchmark; runs are kept only by "
                        f"{' and '.join(kinds.KEEPS_RUNS)} benchmarks (e.g. quality_atari_pong)")
        for flag in ("--keep-runs", "--out"):  # checked before any run, so that no run's result is lost
            value = _flag(args, flag)
            problem = _folder_problem(value) if value is not None else None
            if problem:
                p.error(f"bad {flag} {value!r}: {problem}")
        if args.repeats is not None and args.repeats < 1:
            p.error(f"bad --repeats {args.repeats}; expected a positive integer")
        for name, peer in kinds.PEERS.items():
            checkout, python = _flag(args, peer.checkout_flag), _flag(args, peer.python_flag)
            if (checkout is None) != (python is None):
                p.error(f"{peer.checkout_flag} and {peer.python_flag} go together (a {name} checkout and its venv's "
                        "Python)")
            if checkout and not os.path.isfile(os.path.join(checkout, peer.marker)):
                p.error(f"bad {peer.checkout_flag} {checkout!r}; expected a checkout with {peer.marker}")
    return args


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def default_out(quick: bool, machine_kind: str) -> str:
    """``run``'s results folder without ``--out``: ``experiments/results/<machine kind>/``, or with
    ``--quick`` that kind's folder under the system's temporary directory."""
    base = os.path.join(tempfile.gettempdir(), "accerl_jax-bench-quick") if quick else RESULTS
    return os.path.join(base, machine_kind)


def own_process(b, args) -> tuple[list[str], dict] | None:
    """``(argv, environment)`` of the process that runs ``b`` with its ``host_devices`` where this one has
    another count of CPU devices: this command for ``b`` alone (the same options), ``XLA_FLAGS`` with
    ``--xla_force_host_platform_device_count``; or None (``b`` runs here)."""
    import jax

    if b.host_devices is None or jax.default_backend() != "cpu" or jax.device_count() == b.host_devices:
        return None
    argv = [sys.executable, "-m", "experiments.bench", "run", b.name]
    if args.quick:
        argv.append("--quick")
    for flag in ("--repeats", "--keep-runs", "--out"):
        if _flag(args, flag) is not None:
            argv += [flag, str(_flag(args, flag))]
    if args.seeds is not None:
        argv += ["--seeds", ",".join(map(str, args.seeds))]
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    env = dict(os.environ, XLA_FLAGS=" ".join(kept + [f"{DEVICE_COUNT_FLAG}={b.host_devices}"]))
    return argv, env


def run(args) -> dict:
    """Run the chosen benchmarks in order; each result gets the machine record and is written at once. A
    benchmark with its own ``host_devices`` (:func:`own_process`) runs in a process of its own, which writes
    its JSON; its result is read back from it."""
    peer = {name: {"checkout": _flag(args, f.checkout_flag), "python": _flag(args, f.python_flag)}
            for name, f in kinds.PEERS.items() if _flag(args, f.checkout_flag)}
    out_dir = args.out
    results = {}
    for b in BENCHMARKS if args.name == "all" else [BY_NAME[args.name]]:
        child = own_process(b, args)
        if child is not None:
            argv, env = child
            print(f"{b.name}: in a process of its own on {b.host_devices} host devices", flush=True)
            if subprocess.run(argv, cwd=harness.REPO, env=env).returncode != 0:
                raise ChildError(f"{b.name}'s process ({' '.join(argv[1:])}) failed; its output is above")
            with open(os.path.join(args.out or default_out(args.quick, harness.machine_kind()), f"{b.name}.json")) as f:
                results[b.name] = json.load(f)
            continue
        started, rec = time.perf_counter(), harness.record()
        if out_dir is None:
            out_dir = default_out(args.quick, rec["machine_kind"])
        keep = args.keep_runs if b.kind in kinds.KEEPS_RUNS else None
        result = kinds.measure(b, args.quick, args.repeats, peer, args.seeds, keep)
        result["record"] = harness.finish_record(rec, started)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{b.name}.json"), "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{b.name}: {os.path.join(out_dir, b.name + '.json')}", flush=True)
        results[b.name] = result
    return results


def main(argv=None) -> int:
    args = parse(argv)
    if args.command == "list":
        width = max(len(b.name) for b in BENCHMARKS)
        for b in BENCHMARKS:
            first = b.measures.split(". ")[0].rstrip(".")
            print(f"{b.name:<{width}}  {b.kind:<12} {first}.")
    elif args.command == "run":
        try:
            run(args)
        except harness.KeptRunError as err:  # the runs kept so far stay; the same command continues them
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code
        except ChildError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    elif args.write:
        try:
            page.write(args.write, args.results)
        except (OSError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(page.page(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
