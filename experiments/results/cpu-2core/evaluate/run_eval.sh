#!/usr/bin/env bash
# Trains the main job and a 200k-step Breakout-MinAtar run, then evaluates them (quality numbers only).
set -euo pipefail
PY=/work/main/.venv/bin/python
export PYTHONPATH=/work/wt-measure
rm -rf main breakout
$PY -m accerl_jax.train --logdir main --no-progress > main.log 2>&1
$PY -m accerl_jax.evaluate main --policy actor --episodes 100 --no-progress > eval_main_actor.log 2>&1 && cp main/eval.json eval_cartpole_actor.json
$PY -m accerl_jax.evaluate main --policy learner --episodes 100 --no-progress > eval_main_learner.log 2>&1 && cp main/eval.json eval_cartpole_learner.json
$PY -m accerl_jax.train --env gymnax:Breakout-MinAtar --total-steps 200000 --logdir breakout --no-progress > breakout.log 2>&1
$PY -m accerl_jax.evaluate breakout --policy actor --episodes 32 --no-progress > eval_breakout.log 2>&1 && cp breakout/eval.json eval_breakout_minatar_actor.json
echo done
