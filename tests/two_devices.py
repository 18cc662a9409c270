"""Run a test module's main function in a subprocess that sees N forced CPU devices.

The device count of XLA:CPU is fixed at start-up (``--xla_force_host_platform_device_count``), so
multi-device checks run in a fresh interpreter; it prints ``RESULT <json>``, which is returned.
:func:`run_device_main` takes any N and function name; :func:`run_two_device_main` is N = 2 with the
module's ``_two_device_main``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def device_env(n: int) -> dict:
    """The environment of a subprocess that sees ``n`` CPU devices and imports the tests and the package."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_device_main(module: str, n: int, fn: str = "_device_main", args: tuple = (), timeout: float = 300) -> dict:
    """Run ``module.fn(*args)`` with ``n`` forced CPU devices; return the JSON of its last ``RESULT`` line."""
    code = f"import {module}; {module}.{fn}(*{tuple(args)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=device_env(n), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def run_two_device_main(module: str) -> dict:
    """``module._two_device_main()`` with 2 forced CPU devices."""
    return run_device_main(module, 2, "_two_device_main")
