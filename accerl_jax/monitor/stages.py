"""The stage clock: cumulative wall seconds of each stage of training (:data:`STAGES`)."""
from __future__ import annotations

import contextlib
import time

# Wall seconds per stage: the actor's rollout (split into env stepping and policy inference),
# host->device transfer of rollouts, time the learner waits on the rollout queue, the learner update, and
# compression of the actor's policy (of which distillation). Loops add to the stages they have.
STAGES = ("actor", "env", "inference", "transfer", "queue_wait", "learner", "compress", "distill")


class StageClock:
    """``times``: {stage: cumulative wall seconds} over :data:`STAGES`, all 0.0 at the start."""

    def __init__(self):
        self.times = dict.fromkeys(STAGES, 0.0)

    @contextlib.contextmanager
    def time(self, stage: str):
        """Add the wall seconds of the ``with`` body to ``stage``; the body must block on its outputs."""
        start = time.perf_counter()
        yield
        self.times[stage] += time.perf_counter() - start

    def compressor_stage_time(self, name: str):
        """The ``timer`` for a :func:`~accerl_jax.compressor.chain`'s stages: the ``distill`` stage's seconds
        go to the ``distill`` stage (also counted in ``compress``, the total); other stages are not split."""
        return self.time("distill") if name == "distill" else contextlib.nullcontext()

    def add_time(self, stage: str, seconds: float) -> None:
        self.times[stage] += seconds

    def set_env_time(self, env_seconds: float) -> None:
        """Split the actor time of a fused actor: ``env_seconds`` to env stepping, the rest to inference."""
        self.times["env"] = env_seconds
        self.times["inference"] = self.times["actor"] - env_seconds
