"""The stage times: cumulative wall seconds of each stage of training (:data:`STAGES`), as the driver adds
what the steppers measured (:class:`accerl_jax.platform.clock.StageClock` measures; this only keeps the totals)."""
from __future__ import annotations

# Wall seconds per stage: the actor's rollout (split into env stepping and policy inference),
# host->device transfer of rollouts, time the learner waits on the rollout queue, the learner update, and
# compression of the actor's policy (of which distillation). Loops add to the stages they have.
STAGES = ("actor", "env", "inference", "transfer", "queue_wait", "learner", "compress", "distill")


class StageTimes:
    """``times``: {stage: cumulative wall seconds} over :data:`STAGES`, all 0.0 at the start."""

    def __init__(self):
        self.times = dict.fromkeys(STAGES, 0.0)

    def add_time(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` (wall) to ``stage``."""
        self.times[stage] += seconds

    def set_env_time(self, env_seconds: float) -> None:
        """Split the actor time of a fused actor: ``env_seconds`` to env stepping, the rest to inference."""
        self.times["env"] = env_seconds
        self.times["inference"] = self.times["actor"] - env_seconds
