"""Test-session setup: one persistent XLA compilation cache for the whole session.

Every ``run_training`` call builds fresh jitted functions, so without a cache each tiny run recompiles
the same programs (measured here: 26.7 s for the first 8-update CartPole run, 3.5 s for an identical
second one with the cache). The cache lives in a fresh temporary folder per session, so nothing stale
is ever reused; subprocesses started by tests inherit it through the ``JAX_*`` environment variables.
Compiled programs are the same either way, so results (and bitwise comparisons) are unaffected.

The tests' runs are tiny, so compiling is most of their time: the session compiles with LLVM's
optimization level 0 (:data:`XLA_TEST_FLAGS`, in ``XLA_FLAGS`` before JAX starts its backend, so
subprocesses get it too). That compiles faster and runs slower; the programs' semantics are the same.
A run that measures speed sets its own flags (the benchmarks in ``experiments/`` never import this file).

Under ``-n 2 --dist loadfile`` a test file is one unit of work. pytest-xdist hands the units out in order
of their number of tests, which leaves files of few but long tests (subprocesses, notebooks) for the end,
where one worker runs them while the other idles. :func:`pytest_xdist_make_scheduler` hands out the files
of :data:`COSTLIEST_FIRST` first, in that order (longest processing time first: the files left for the
end are short, so both workers finish close together); the other files follow in xdist's own order.
"""
from __future__ import annotations

import os

# Before ``import jax``: JAX reads XLA_FLAGS when it starts its backend (the first computation).
XLA_TEST_FLAGS = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{XLA_TEST_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

# Test files by CPU time of one run (2-core CPU machine, persistent cache above), costliest first: the
# processes a file starts (CLI runs, devices, notebooks) and its compilations. Order only: a file missing
# here still runs, after these; a stale order only costs balance.
COSTLIEST_FIRST = (
    "test_devices.py", "test_readme.py", "test_multihost_resume.py", "test_experiments.py", "test_compressor.py", "test_notebooks.py", "test_learner.py",
    "test_cli_correctors.py", "test_cli.py", "test_layouts.py", "test_evaluate_export.py", "test_bad_input.py",
    "test_reliability.py", "test_anakin.py", "test_auto.py", "test_losses.py", "test_corrector.py",
    "test_sebulba.py", "test_driver.py", "test_loop.py", "test_components.py", "test_envs.py", "test_monitor.py",
    "test_register_compressor.py", "test_plan.py", "test_plot.py",
)

CACHE_SETTINGS = {
    "jax_compilation_cache_dir": None,  # set per session below
    "jax_persistent_cache_min_compile_time_secs": 0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist (``-n 2``): one cache shared by the workers, in their common session folder.
        cache = tmp_path_factory.getbasetemp().parent / "xla_cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("xla_cache")
    settings = dict(CACHE_SETTINGS, jax_compilation_cache_dir=str(cache))
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)
    yield


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: a run without xdist never calls it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``: the files of :data:`COSTLIEST_FIRST` first (see the module docstring)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}

    class CostliestFileFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # min keeps the first of equal ranks: xdist's own order among the files not listed
            first = min(self.workqueue, key=lambda scope: rank.get(os.path.basename(scope), len(rank)))
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return CostliestFileFirst(config, log)
