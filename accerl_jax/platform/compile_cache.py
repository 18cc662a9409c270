"""XLA's persistent compilation cache for a run (``--compile-cache``): compiled programs are kept on disk,
so a later process that builds the same programs (same flags, shapes, JAX version and devices) loads them
instead of compiling them again, which is most of a run's start-up.

JAX keys each entry by the program, its compile options, the devices and the JAX/XLA versions, so a
stale entry is never used; the compiled programs are the same either way, so results are unaffected.
The cache is JAX's own (``jax_compilation_cache_dir``); JAX reads the setting once per process, at its
first compile.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import jax

ENV_VAR = "JAX_COMPILATION_CACHE_DIR"  # JAX's own variable for the folder; 'auto' follows it when set
_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
_counts = {"hits": 0, "misses": 0}
_lock = threading.Lock()
_listening = False


def default_folder() -> str:
    """``$XDG_CACHE_HOME/accerl_jax/xla``, or ``~/.cache/accerl_jax/xla`` where that is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "accerl_jax", "xla")


def folder_for(setting: str) -> Optional[str]:
    """The folder ``--compile-cache setting`` names: ``'off'`` -> None; ``'auto'`` -> ``$JAX_COMPILATION_CACHE_DIR``
    if set, else :func:`default_folder`; any other value is the folder itself (absolute)."""
    if setting == "off":
        return None
    if setting == "auto":
        return os.environ.get(ENV_VAR) or default_folder()
    return os.path.abspath(os.path.expanduser(setting))


def _count(event: str, **_) -> None:
    name = _EVENTS.get(event)
    if name is not None:
        with _lock:
            _counts[name] += 1


def use(setting: str) -> Optional[str]:
    """Point JAX's persistent compilation cache at ``folder_for(setting)`` (every program is cached, however
    short its compile) and count its hits and misses from here on (:func:`counts`).

    A folder that cannot be made leaves the cache off, with a warning on stderr: the cache only saves
    time, so it never stops a run.

    Returns:
      The folder in use, or None (off).
    """
    global _listening
    folder = folder_for(setting)
    if folder is not None:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            print(f"warning: --compile-cache {setting!r}: cannot use {folder} ({err.strerror}); compiling without "
                  "a cache", file=sys.stderr)
            folder = None
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening = True
    return folder


def folder_in_use() -> Optional[str]:
    """The folder JAX's settings name for its compilation cache (the last :func:`use` sets them), or None
    where the cache is off."""
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None


def counts() -> dict[str, int]:
    """``{"hits": programs loaded from the cache, "misses": programs compiled and stored}`` in this process
    since :func:`use` was first called (0, 0 before)."""
    with _lock:
        return dict(_counts)
