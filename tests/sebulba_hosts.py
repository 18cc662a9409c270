"""One process of the two-process Sebulba run of tests/test_sebulba.py (its own module: importing the test
module would start JAX's backend before the process joins the multi-host run)."""
from __future__ import annotations

import json
import os
import signal

# Two processes on 127.0.0.1, 2 CPU devices and --num-envs 4 each (a global batch of 8 over 4 learner
# devices), envpool CartPole, a distilled student and both normalisations: everything a process must
# agree on with the others (the global batch's statistics, the student's observations and teacher).
ARGS = ["--env", "envpool:CartPole-v1", "--loop", "sebulba", "--num-envs", "4", "--rollout-length", "4",
        "--hidden-sizes", "16", "--compressor", "distill:tiny", "--distill-steps", "1", "--queue-size", "1",
        "--normalize-observations", "--normalize-rewards", "--log-every", "1", "--checkpoint-every", "0",
        "--total-steps", str(10 * 8 * 4), "--no-progress"]


def main(pid: int, port: int, logdir: str) -> None:
    """One of two processes: the Sebulba CLI run, which process 0 alone interrupts with SIGINT once its
    actor starts its 5th rollout (after at least 2 updates: --queue-size 1), then ``--resume`` of the run
    to its budget. Prints the exit codes and, at each session's end, a digest of its normalisation
    statistics."""
    from accerl_jax import train
    from accerl_jax.config import Config
    from accerl_jax.run import distributed

    distributed.join(Config(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid))
    from accerl_jax import async_actor  # touches JAX: after joining
    from accerl_jax.loops import sebulba
    from accerl_jax.run import shards

    real_rollouts, real_close = async_actor.AsyncActor.rollouts, sebulba.SebulbaStepper.close
    state = {"session": 0}

    def rollouts(self, *args, **kwargs):
        for n, item in enumerate(real_rollouts(self, *args, **kwargs), 1):
            yield item
            if n == 4 and pid == 0 and state["session"] == 0:
                os.kill(os.getpid(), signal.SIGINT)

    def close(self):
        print(f"NORM {state['session']} {shards.params_digest(self.norm.state)}", flush=True)
        state["session"] += 1
        return real_close(self)

    async_actor.AsyncActor.rollouts, sebulba.SebulbaStepper.close = rollouts, close
    argv = [*ARGS, "--logdir", logdir, "--coordinator-address", f"127.0.0.1:{port}", "--num-processes",
            "2", "--process-id", str(pid)]
    codes = [train.main(argv)]
    codes.append(train.main(argv + ["--resume", logdir]))
    print("RESULT " + json.dumps({"codes": codes}), flush=True)
