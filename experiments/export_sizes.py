"""Sizes of exported policies (``python -m accerl_jax.export``'s program) per compressor, against the learner's.

For each env (CartPole: the MLP; Breakout-MinAtar: the CNN) and compressor, the compressor's first actor
parameters (``init`` on a fresh learner; sizes depend on the networks, not on training) are exported with
:func:`accerl_jax.export.export_program`, as the CLI does. Writes ``experiments/results/export_sizes.{json,md}``.

    python experiments/export_sizes.py [--out experiments/results/export_sizes]   # writes OUT.json and OUT.md
"""
from __future__ import annotations

import argparse
import json
import os

import jax

from accerl_jax import networks
from accerl_jax import plan as plan_lib
from accerl_jax.config import Config
from accerl_jax.envs import make_env
from accerl_jax.export import export_program
from accerl_jax.run import make_run_compressor

ENVS = ("gymnax:CartPole-v1", "gymnax:Breakout-MinAtar")
COMPRESSORS = ("none", "distill:small", "distill:small+int8")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "export_sizes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT, help="path without extension: OUT.json and OUT.md are written")
    out = parser.parse_args().out
    rows = []
    for env_id in ENVS:
        for compressor in COMPRESSORS:
            cfg = Config(env=env_id, compressor=compressor, num_envs=16)
            env = make_env(env_id, cfg.num_envs)
            spec = plan_lib.make_plan(cfg, env.info).spec
            apply = networks.make_apply(spec)
            params = networks.init_params(spec, jax.random.PRNGKey(0))
            comp = make_run_compressor(cfg, spec, apply, env.info.continuous)
            actor_params, _ = comp.init(params, jax.random.PRNGKey(1), env.reset(jax.random.PRNGKey(2))[1])
            program = export_program(comp.actor_apply(apply), actor_params, env.info)
            learner = export_program(apply, params, env.info)
            rows.append({"env": env_id, "family": spec.family, "compressor": compressor,
                         "param_count": networks.param_count(actor_params),
                         "param_bytes": networks.param_bytes(actor_params), "program_bytes": len(program),
                         "learner_param_bytes": networks.param_bytes(params), "learner_program_bytes": len(learner),
                         "program_vs_learner": len(program) / len(learner)})
            print(rows[-1], flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump({"jax_version": jax.__version__, "rows": rows}, f, indent=2)
    lines = ["| env | compressor | parameters | parameter bytes | program bytes | program / learner's |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['env']} | {r['compressor']} | {r['param_count']:,} | {r['param_bytes']:,} | "
              f"{r['program_bytes']:,} | {r['program_vs_learner']:.3f} |" for r in rows]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
