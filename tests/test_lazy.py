"""accerl_jax.platform.lazy: modules imported at first use (start-up), and what a run leaves unimported."""
import json
import subprocess
import sys
import textwrap

import pytest

from accerl_jax.platform import lazy


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``lazypkg`` whose module code records each time it runs (in ``builtins.lazy_runs``)."""
    root = tmp_path / "lazypkg"
    root.mkdir()
    record = "import builtins\nbuiltins.lazy_runs = getattr(builtins, 'lazy_runs', []) + [__name__]\n"
    (root / "__init__.py").write_text(record + "VALUE = 1\n")
    (root / "sub.py").write_text(record + "def twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "lazy_runs", [], raising=False)
    yield builtins
    for name in ("lazypkg.sub", "lazypkg"):
        sys.modules.pop(name, None)


def test_a_deferred_module_runs_at_its_first_attribute_and_only_once(package):
    module = lazy.lazy_module("lazypkg")
    assert isinstance(module, lazy.DeferredModule) and package.lazy_runs == []
    import lazypkg  # a later import statement gets the stand-in without running the module

    assert lazypkg is module and package.lazy_runs == []
    assert lazypkg.VALUE == 1 and package.lazy_runs == ["lazypkg"]
    assert module.VALUE == 1 and package.lazy_runs == ["lazypkg"]
    assert type(sys.modules["lazypkg"]) is not lazy.DeferredModule  # the real module took its place
    with pytest.raises(AttributeError):
        module.missing


def test_a_deferred_submodule_is_its_parents_attribute_and_loads_at_first_use(package):
    sub = lazy.lazy_module("lazypkg.sub")
    assert package.lazy_runs == ["lazypkg"]  # the parent is imported for real, the submodule is not
    import lazypkg.sub as again

    assert again is sub and sys.modules["lazypkg"].sub is sub and package.lazy_runs == ["lazypkg"]
    assert sub.twice(3) == 6 and package.lazy_runs == ["lazypkg", "lazypkg.sub"]
    assert lazy.lazy_module("lazypkg.sub") is sys.modules["lazypkg.sub"]  # imported: returned as it is


def test_a_module_that_is_not_installed_is_none():
    assert lazy.lazy_module("no_such_module_here") is None
    assert "no_such_module_here" not in sys.modules


def test_a_training_process_leaves_gymnax_plotting_libraries_qwix_and_the_monitor_sinks_unimported():
    code = textwrap.dedent("""
        import json, sys
        import accerl_jax.run.training
        from accerl_jax.platform.lazy import DeferredModule
        from gymnax.environments.misc import pong
        names = ("seaborn", "matplotlib.pyplot", "qwix")
        # The Monitor's sinks import their libraries when a run first writes to them.
        sinks = ("tensorboardX", "wandb", "matplotlib.figure", "rich.progress")
        print(json.dumps({"deferred": {n: isinstance(sys.modules.get(n), DeferredModule) for n in names},
                          "sinks_imported": [n for n in sinks if n in sys.modules],
                          "scipy_stats": "scipy.stats" in sys.modules,
                          "palette": len(pong.sns.color_palette("cubehelix", 3)),
                          "scipy_stats_after_use": "scipy.stats" in sys.modules}))
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                     .stdout.strip().splitlines()[-1])
    assert out["deferred"] == {"seaborn": True, "matplotlib.pyplot": True, "qwix": True}
    assert not out["scipy_stats"] and out["sinks_imported"] == []
    assert out["palette"] == 3 and out["scipy_stats_after_use"]  # used: seaborn (and scipy) load as usual
