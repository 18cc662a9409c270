"""The Anakin stepper (``--loop anakin``; the default for gymnax): the whole actor-learner iteration in
one jitted program (:mod:`accerl_jax.loops.anakin_program`; Podracer's Anakin, Hessel et al. 2021,
https://arxiv.org/abs/2104.06272), dispatched one *chunk* of updates at a time (up to the next
``--log-every`` / ``--checkpoint-every`` boundary). It yields one :class:`~accerl_jax.run.driver.Step` per
chunk; between chunks the :class:`~accerl_jax.run.driver.Driver` logs, checkpoints and checks for signals,
so a signal stops the run within a chunk. The next chunk is dispatched *before* the step is yielded, so
that the host's work runs while the program does.

Environments: gymnax envs are pure functions, stepped in the program. envpool envs (only by an explicit
``--loop anakin``) are stepped in the same program through envpool's XLA interface
(:class:`accerl_jax.envs.envpool_env.EnvpoolXlaEnv`); the pool cannot be copied or saved, so envpool runs
take one seed and one local device, and ``--resume`` restarts the envs (as the sequential loop does).

With several processes (one mesh over all their devices) the state is a set of global arrays and every
process dispatches the same chunks; the outputs are replicated, so every process reads all episodes. The
next chunk is then dispatched after the driver has logged and checkpointed the last one, not before:
the checkpoint's gathers and the driver's stop vote are collectives, which must not run beside the
chunk's own.

``--num-seeds N`` trains N independent seeds (``--seed + k``) at once: the chunk is ``vmap``-ed over a
leading seed axis of the state. ``--compressor auto`` (one seed) takes its decisions between chunks
(:class:`~accerl_jax.loops.anakin_auto.AutoChunks`, through the wiring every loop shares,
:class:`~accerl_jax.loops.auto.AutoControl`).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.run import checkpoint
from accerl_jax.run.driver import Bad, Episodes, Events, Final, Step
from accerl_jax.run.guard import MAX_SKIP_STREAK, quantity
from accerl_jax.loops.anakin_auto import AutoChunks
from accerl_jax.loops.anakin_program import AnakinState, UpdateOutput, _seed, make_chunk
from accerl_jax.loops import pieces, shared
from accerl_jax.loops.anakin_state import initial_state, local_view, place_state, restored_state
from accerl_jax.run.build import Run


def chunk_episodes(out: UpdateOutput, updates: int) -> Episodes:
    """The episodes of the first ``updates`` updates of one seed's chunk output (``[C, T, B]`` arrays,
    flattened to ``[updates * T, B]`` in time order)."""
    def flat(x):
        x = np.asarray(x)[:updates]
        return x.reshape((-1,) + x.shape[2:])

    return Episodes(flat(out.episode_return), flat(out.finished), flat(out.episode_length))


class AnakinStepper:
    """One chunk of fused updates per step (module docstring)."""

    def __init__(self, run: Run):
        self.run = run  # its actor runs in the fused program (envpool: AnakinActor, accerl_jax.run.build)
        self.seeds, self.lag = run.cfg.num_seeds, run.cfg.policy_lag + 1
        self.chunk_fn = AutoChunks(run) if run.plan.auto else make_chunk(run)
        self.fused_wait = float(run.extra.get("fused_wait_s", 0.0))  # seconds the host waited for the program
        self.state = self.chunk_end = None
        self.flops: pieces.BackgroundFlops | None = None  # counted from the last chunk's dispatch on (_dispatch)
        self.shapes: AnakinState | None = None  # seed 0's state shapes, for the FLOPs count (steps)
        self.lag_versions = float("nan")  # of the last update, seed 0
        self.skipped = np.asarray(run.extra.get("skipped_updates", 0))
        # Several processes: the next chunk is dispatched only after the driver has logged and saved this
        # one, because the checkpoint's gathers and the stop vote are collectives of their own, and two
        # programs' collectives in flight at once may interleave differently on two processes.
        self.pipelined = run.plan.num_processes == 1

    def _boundary(self, after: int) -> int:
        cfg = self.run.cfg
        ends = [self.run.plan.num_updates, (after // cfg.log_every + 1) * cfg.log_every]
        if cfg.checkpoint_every:
            ends.append((after // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
        return min(ends)

    def _dispatch(self, s: AnakinState, after: int):
        end = self._boundary(after)
        pending = (end, *self.chunk_fn(s, end - after))  # returns at once: the program runs in the background
        if end >= self.run.plan.num_updates:
            self._count_flops()
        return pending

    def _snapshot(self, s: AnakinState, completed: int) -> checkpoint.TrainState:
        # The same TrainState as the sequential loop saves: the lagged sets this run has made so far.
        n = min(completed, self.run.cfg.policy_lag) + 1
        return shared.snapshot(self.run, s.learner, s.actor_params[self.lag - n:], s.compressor, carry=s.carry,
                               normalizer=s.normalizer)

    def steps(self, driver):
        run, seeds = self.run, self.seeds
        if run.plan.resume is None:
            states = [initial_state(run, run.cfg.seed + k) for k in range(seeds)]
            state = states[0] if seeds == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *states)
        else:
            state = restored_state(run, self.skipped.tolist())
        self.state = place_state(run, state)
        completed = run.start_update
        self.shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:] if seeds > 1 else x.shape, x.dtype,
                                                                  weak_type=x.weak_type),
                                   self.state)  # read before the program may take the buffers
        pending = self._dispatch(self.state, completed) if driver.keep_going(completed) else None
        while pending is not None:
            end, new_state, out, chunk_end = pending
            pending = hard_stop = None
            start = time.perf_counter()
            out, chunk_end, bad_update, bad_quantity, skipped = jax.device_get(local_view(
                (out, chunk_end, new_state.bad_update, new_state.bad_quantity, new_state.skipped)))  # waits
            self.fused_wait += time.perf_counter() - start
            self.skipped = np.asarray(skipped)
            bad_seeds = np.asarray(bad_update).reshape(-1)
            bad_update = int(bad_seeds[bad_seeds > 0].min()) if np.any(bad_seeds > 0) else 0  # any seed stops it
            last = (bad_update if bad_update else end) - completed  # updates of this chunk that count
            outs = [_seed(out, k, seeds) for k in range(seeds)]
            metrics = [{name: v[last - 1] for name, v in o.metrics.items()} for o in outs]
            self.lag_versions = float(metrics[0].get("policy_lag_versions", np.nan))
            if self.pipelined and not bad_update and driver.keep_going(end) and end < run.plan.num_updates:
                # Pipelined: the next chunk is dispatched before the driver logs and checkpoints this one
                # (a diverged state is never continued).
                try:
                    pending = self._dispatch(new_state, end)
                except KeyboardInterrupt as err:  # a hard stop (second signal) while dispatching takes
                    hard_stop = err  # effect once this finished chunk is counted
            self.state, self.chunk_end, completed = new_state, chunk_end, completed + last
            bad = None
            if bad_update:
                seed_k = int(np.argmax(bad_seeds == bad_update))
                bad = Bad(quantity(int(np.asarray(bad_quantity).reshape(-1)[seed_k])), bad_update, seed_k,
                          MAX_SKIP_STREAK + 1 if run.cfg.on_nan == "skip" else 0)
            refreshed = bool(np.any(out.refreshed[..., :last]))
            refresh = [_seed(chunk_end, k, seeds).refresh_divergence for k in range(seeds)] if refreshed else None
            # --compressor auto: the decisions taken for the chunks dispatched so far (AutoChunks).
            decisions = self.chunk_fn.control.take_decisions() if run.plan.auto else ()
            yield Step(completed, last, metrics, [chunk_episodes(o, last) for o in outs],
                       None if bad else self._snapshot(new_state, completed), bad, refresh=refresh,
                       events=Events(decisions=decisions))
            if hard_stop is not None:
                raise hard_stop
            if not self.pipelined and not bad_update and driver.keep_going(end) and end < run.plan.num_updates:
                pending = self._dispatch(new_state, end)

    def _count_flops(self) -> None:
        """Start counting the pieces' FLOPs (:class:`~accerl_jax.loops.pieces.BackgroundFlops`, for the
        summary's cost split); :meth:`_dispatch` calls it with the chunk that ends the budget: counting traces
        and lowers the pieces, host time that slowed the training it ran beside by about as much; from the
        last chunk on it overlaps the end of the run instead."""
        run, shapes = self.run, self.shapes
        if (self.flops is not None or run.plan.process_id != 0 or not pieces.has_pieces(run)
                or run.counted_flops is not None):  # counted before training (--compressor auto kept none)
            return
        self.flops = pieces.BackgroundFlops(run, shapes.learner, shapes.actor_params[0], shapes.compressor,
                                            shapes.carry)

    def row(self, update: int) -> list:
        return [dict(time_fused_wait_s=self.fused_wait, **_seed(self.chunk_end, k, self.seeds).divergence)
                for k in range(self.seeds)]

    def env_seconds(self, update: int) -> None:
        return None  # env stepping is not split from the fused program

    def extra(self) -> dict:
        skipped = self.skipped.tolist() if self.seeds > 1 else int(self.skipped)
        return {"skipped_updates": skipped, "fused_wait_s": self.fused_wait}

    def final(self) -> list:
        cfg, info = self.run.cfg, self.run.info
        out = []
        for k in range(self.seeds):
            s = _seed(self.state, k, self.seeds)
            learner, actor_params, obs = local_view((s.learner, s.actor_params[-1], s.obs))
            obs = obs.reshape((cfg.rollout_length, info.num_envs * self.run.plan.num_processes) + tuple(info.obs_shape))
            out.append(Final(learner, actor_params, obs))
        return out

    def fields(self, times: dict) -> dict:
        cfg = self.run.cfg
        return dict(loop="anakin", fused_wait_s=self.fused_wait, num_seeds=self.seeds,
                    policy_lag_versions=self.lag_versions,
                    compress_every=cfg.compress_every, env_time_source="not split: one fused program",
                    **(self.chunk_fn.summary() if self.run.plan.auto else {}))

    def cost_split(self) -> dict:
        """The per-update cost split of this run's pieces (:func:`accerl_jax.loops.pieces.cost_split`) on
        seed 0's final state: FLOPs always, seconds with ``--cost-split`` (each piece compiled and timed
        alone; each time then includes one dispatch). The FLOPs are counted in a background thread while
        the last chunk runs (:class:`~accerl_jax.loops.pieces.BackgroundFlops`), the timing after training,
        so that neither slows training. {} where the pieces cannot be split
        (:func:`~accerl_jax.loops.pieces.has_pieces`)."""
        run = self.run
        if not pieces.has_pieces(run) or self.state is None:
            return {}
        s = _seed(self.state, 0, self.seeds)
        flops = self.flops.result() if self.flops is not None else None
        return pieces.cost_split(run, s.learner, s.actor_params[0], s.compressor, s.carry, timed=run.cfg.cost_split,
                                 flops=flops)

    def close(self) -> Events:
        # A decision for a chunk dispatched after the last step (a hard stop while dispatching).
        return Events(decisions=self.chunk_fn.control.take_decisions() if self.run.plan.auto else ())
