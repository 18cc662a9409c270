"""--compile-cache: which folder each setting names (the cache itself is JAX's; the reuse of its entries
by a second identical run is checked in test_reliability.py)."""
from __future__ import annotations

import os

from accerl_jax.platform import compile_cache


def test_auto_follows_jax_variable_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compile_cache.folder_for("auto") == str(tmp_path / "jax")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.folder_for("auto") == str(tmp_path / "xdg" / "accerl_jax" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.folder_for("auto") == str(tmp_path / "home" / ".cache" / "accerl_jax" / "xla")


def test_off_and_explicit_folders(monkeypatch, tmp_path):
    assert compile_cache.folder_for("off") is None
    monkeypatch.chdir(tmp_path)
    assert compile_cache.folder_for("cache") == os.path.join(str(tmp_path), "cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.folder_for("~/xla") == str(tmp_path / "home" / "xla")
