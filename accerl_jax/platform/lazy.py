"""Modules imported on first use instead of at import time.

Start-up is most of a short run's time, and much of it is imports that a run never uses: importing
gymnax imports its render helpers' ``matplotlib.pyplot`` and ``seaborn`` (and with it ``scipy.stats``)
with every environment, and qwix is needed only by the int8 compressor. :func:`lazy_module` puts a
stand-in module into ``sys.modules``; the first attribute it is asked for that it does not have imports
the real module, and from then on every attribute is read from the real one, so code that uses it sees
no difference. (The standard library's :class:`importlib.util.LazyLoader` does not serve here: on
Python 3.11 a second ``import`` statement of a lazy module reads its ``__spec__``, which loads it.)
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

_lock = threading.RLock()


class DeferredModule(types.ModuleType):
    """A stand-in in ``sys.modules`` for a module not imported yet (:func:`lazy_module`)."""

    def __getattr__(self, attr: str):  # called only for attributes the stand-in lacks
        return getattr(_load(self), attr)


def _load(stand_in: DeferredModule) -> types.ModuleType:
    """Import the real module behind ``stand_in`` (once) and return it."""
    name = stand_in.__name__
    with _lock:
        real = stand_in.__dict__.get("_deferred_real")
        if real is None:
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
            real = importlib.import_module(name)  # also sets it as its parent package's attribute
            stand_in.__dict__["_deferred_real"] = real
        return real


def lazy_module(name: str) -> types.ModuleType | None:
    """``name`` imported at its first use: the module itself if already imported, None if it is not
    installed, else a :class:`DeferredModule` registered in ``sys.modules`` (and, for a submodule such as
    ``matplotlib.pyplot``, as its parent package's attribute; the parent is imported for real), so that a
    later ``import name`` anywhere gets the stand-in and its first attribute access imports the module."""
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        try:
            if importlib.util.find_spec(name) is None:
                return None
        except (ImportError, ValueError):
            return None
        stand_in = DeferredModule(name)
        sys.modules[name] = stand_in
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, stand_in)
        return stand_in


def defer(*names: str) -> None:
    """:func:`lazy_module` for each of ``names`` (call it before importing a library that imports them
    only for features a run may not use)."""
    for name in names:
        lazy_module(name)
