"""The training command line's flags in groups, the common ones first.

:class:`~accerl_jax.config.Config` stays one flat dataclass (what the code and checkpoints use); for the
command line, :func:`parse` builds a dataclass of groups (each a dataclass of some of Config's fields, with
Config's field docstrings as their help) whose flags keep Config's names (tyro's ``OmitArgPrefixes``), and
flattens the result back into a Config.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import typing
from typing import Annotated

import tyro

from accerl_jax.config import Config

# (group, title, Config fields), in the order --help shows them. Every Config field is in exactly one.
GROUPS = (
    ("common", "the run: what to train, how long, where the outputs go", (
        "preset", "config", "env", "compressor", "corrector", "loss", "total_steps", "num_envs", "rollout_length",
        "seed", "logdir", "loop", "resume", "overwrite")),
    ("learner", "the learner: optimizer, network, losses, off-policy correction", (
        "learning_rate", "anneal_lr", "hidden_sizes", "reward_clip", "discount", "lambda_", "clip_rho_threshold",
        "clip_pg_rho_threshold", "entropy_coef", "value_coef", "max_grad_norm", "ppo_clip", "epochs", "minibatches")),
    ("compression", "the actor's compressed policy: distillation, refresh, --compressor auto", (
        "distill_steps", "distill_learning_rate", "distill_async", "distill_reuse_teacher", "compress_every",
        "policy_lag", "max_actor_kl",
        "auto_candidates", "auto_every", "auto_max_clip")),
    ("loops", "loops: seeds in one program (Anakin), actor threads and queues (Sebulba)", (
        "num_seeds", "actor_threads", "actor_batch", "actor_device", "queue_size")),
    ("outputs", "logging, checkpoints, failures", (
        "log_every", "return_window", "progress", "cost_split", "wandb", "wandb_project", "checkpoint_every",
        "keep_checkpoints", "on_nan")),
    ("hosts", "multi-host training (one process per host)", ("coordinator_address", "num_processes", "process_id")),
)


def field_docs() -> dict[str, str]:
    """Config's field docstrings (the string under each field in its source), by field name."""
    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())  # one paragraph: the help wraps it
    return docs


@functools.lru_cache(maxsize=1)
def grouped_class():
    """The dataclass of groups tyro parses (built once)."""
    hints = typing.get_type_hints(Config, include_extras=True)
    docs = field_docs()
    defaults = Config()
    groups = []
    for name, title, fields in GROUPS:
        members = []
        for f in fields:
            hint, meta = hints[f], {}
            if typing.get_origin(hint) is Annotated:  # e.g. lambda_'s own name and alias
                hint, *extra = typing.get_args(hint)
                for m in extra:
                    meta.update(name=m.name, aliases=m.aliases)
            arg = tyro.conf.arg(help=docs.get(f, ""), **{k: v for k, v in meta.items() if v is not None})
            members.append((f, Annotated[hint, arg], dataclasses.field(default=getattr(defaults, f))))
        cls = dataclasses.make_dataclass(name.capitalize(), members)
        groups.append((name, Annotated[cls, tyro.conf.OmitArgPrefixes, tyro.conf.arg(help=title)],
                       dataclasses.field(default_factory=cls)))
    return dataclasses.make_dataclass("TrainArgs", groups)


def parse(argv: list[str], default: Config, prog: str) -> Config:
    """Parse ``argv`` (tyro) with ``default``'s values as the defaults; ``--help`` prints the groups and exits."""
    cls = grouped_class()
    values = dataclasses.asdict(default)
    start = cls(**{name: typing.get_args(t)[0](**{f: values[f] for f in fields})
                   for (name, _, fields), t in zip(GROUPS, typing.get_type_hints(cls, include_extras=True).values())})
    args = tyro.cli(cls, args=argv, default=start, prog=prog, description=inspect.cleandoc(Config.__doc__ or ""))
    return Config(**{f: getattr(getattr(args, name), f) for name, _, fields in GROUPS for f in fields})
