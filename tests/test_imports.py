"""Imports point one way (docs/DESIGN.md, "Layout"): each module of ``accerl_jax`` imports only from its
own layer or the layers below it, at module level or inside a function alike."""
from __future__ import annotations

import ast
import pathlib

import pytest

import accerl_jax

PACKAGE = pathlib.Path(accerl_jax.__file__).parent

# The layers, lowest first: a module may import from its own layer and those before it.
LAYERS = [
    # seeds imports nothing (accerl_jax.envs would start JAX's backend: the plan checks seeds before a
    # multi-host process joins its run).
    ("types", "config", "seeds"),
    # run.folder (the run folder's files: claim, lock, trim; it imports only config) sits this low
    # because the Monitor, which writes into the folder, asks it which files are the run's.
    ("platform", "run.folder"),
    ("corrector", "networks", "envs", "normalize"),
    ("compressor",),
    ("actor", "async_actor", "learner", "monitor", "search"),  # search: an agent family (actor + loss)
    ("run",),  # one run's life: plan, build, driver and its parts (not run.training)
    ("loops",),
    ("run.training",),  # run_training: the one module of run/ that drives a stepper of loops/
    ("tools",),
    ("train", "evaluate", "export", "plot"),  # the commands
]


def layer(module: str) -> int:
    """The layer of a module ``accerl_jax.<a>[.<b>...]``: its most specific entry in :data:`LAYERS`.

    Raises:
      KeyError: a module in no layer (a new top-level module must be given one here and in DESIGN.md).
    """
    parts = module.split(".")[1:]
    for depth in (2, 1):
        key = ".".join(parts[:depth])
        for rank, names in enumerate(LAYERS):
            if key in names:
                return rank
    raise KeyError(f"{module} is in no layer of tests/test_imports.py's LAYERS")


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``accerl_jax`` module that ``tree`` imports, with its line: ``from accerl_jax import x`` names
    the module ``accerl_jax.x`` where ``x`` is one, or the module of an exported name
    (``accerl_jax._EXPORTS``); the package itself (``import accerl_jax``) is below every layer."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("accerl_jax.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "accerl_jax":
                for a in node.names:
                    if (PACKAGE / f"{a.name}.py").exists() or (PACKAGE / a.name).is_dir():
                        found.append((node.lineno, f"accerl_jax.{a.name}"))
                    elif a.name in accerl_jax._EXPORTS:
                        found.append((node.lineno, accerl_jax._EXPORTS[a.name]))
            elif node.module.startswith("accerl_jax."):
                found.append((node.lineno, node.module))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_a_module_imports_only_from_its_layer_or_below(path):
    name = module_name(path)
    mine = layer(name)
    upward = [f"line {line}: {target}" for line, target in imported(ast.parse(path.read_text()))
              if layer(target) > mine]
    assert not upward, f"{name} (layer {LAYERS[mine]}) imports from above it: {upward}"


def test_the_check_sees_an_upward_import():
    tree = ast.parse("def f():\n    from accerl_jax.run import checkpoint\n")
    assert [layer(t) for _, t in imported(tree)] == [layer("accerl_jax.run.checkpoint")]
    assert layer("accerl_jax.run.checkpoint") > layer("accerl_jax.learner")
    assert layer("accerl_jax.run.training") > layer("accerl_jax.loops.anakin") > layer("accerl_jax.run.driver")


def test_the_top_level_holds_only_what_the_layers_name():
    """``ls accerl_jax``: every entry (module or folder) is in a layer, so a new one is placed on purpose."""
    entries = {p.stem for p in PACKAGE.iterdir() if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith("__")}
    named = {n.split(".")[0] for names in LAYERS for n in names}
    assert entries == named, (sorted(entries - named), sorted(named - entries))


def test_the_readme_layout_block_lists_the_top_level_as_ls_shows_it():
    """README.md's layout block has one line per entry of ``ls accerl_jax`` (folders with a slash)."""
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("```text\naccerl_jax/"):]
    block = block[: block.index("```", 3)]
    listed = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line[2] != " "}
    entries = {p.name + ("/" if p.is_dir() else "") for p in PACKAGE.iterdir()
               if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith("__")}
    assert listed == entries, (sorted(entries - listed), sorted(listed - entries))
