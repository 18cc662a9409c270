"""The Anakin stepper (``--loop anakin``; the default for gymnax): the whole actor-learner iteration in
one jitted program (:mod:`accerl_jax.loops.anakin_program`; Podracer's Anakin, Hessel et al. 2021,
https://arxiv.org/abs/2104.06272), dispatched one *chunk* of updates at a time (up to the next
``--log-every`` / ``--checkpoint-every`` boundary). It yields one :class:`~accerl_jax.run.driver.Step` per
chunk; between chunks the :class:`~accerl_jax.run.driver.Driver` logs, checkpoints and checks for signals,
so a signal stops the run within a chunk. After the first chunk, two chunks are in flight at once: once a
chunk's outputs are read, the chunk after the next one is dispatched (from the next one's state, not yet
computed) before the step is yielded, so that the host's work runs while the program does and the device
never waits for the host; a chunk dispatched ahead is dropped, never counted, where the one before it
ends the run (a stop, a divergence). The host reads each chunk's outputs as a few packed arrays
(:class:`~accerl_jax.loops.anakin_program.ChunkOutput`), one copy each. With several devices XLA:CPU's
dispatch of the chunk ahead returns only once its input state (the chunk in flight's) is computed, so the
host logs a chunk one chunk later than it read it (the devices are as busy either way): each step carries
the moment its outputs were read (``Step.done_at``), which its Monitor row's ``wall_time_s`` is taken at,
not the moment it is logged (docs/RESULTS.md, "Rows a chunk late on two devices").

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

import collections
import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.run import checkpoint, replicas
from accerl_jax.run.driver import Bad, Episodes, Events, Final, Step
from accerl_jax.run.guard import MAX_SKIP_STREAK, quantity
from accerl_jax.loops.anakin_auto import AutoChunks
from accerl_jax.loops.anakin_program import AnakinState, UpdateOutput, _seed, make_chunk, unpack
from accerl_jax.loops import pieces, shared
from accerl_jax.loops.anakin_state import local_view, place_state, replica_states, restored_state
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
        self.seeds, self.lag = replicas.count(run.cfg), run.cfg.policy_lag + 1  # replicas: seeds x sweep
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
        # Chunks in flight at once. One process, a fixed compressor: two, so that the device never waits for
        # the host: chunk j + 2 is dispatched (from chunk j + 1's not yet computed state) before the host
        # fetches and logs chunk j, and dropped unrun-for if chunk j + 1 turns out to be the last. With one,
        # the device idled between each chunk's end and the next dispatch (the outputs' fetch and the
        # dispatch itself, ~1 ms against a ~4 ms chunk at the default job's shapes). --compressor auto
        # decides between chunks from the previous chunk's state, so it runs one at a time.
        self.depth = 2 if self.pipelined and not run.plan.auto else 1

    def _boundary(self, after: int) -> int:
        cfg = self.run.cfg
        ends = [self.run.plan.num_updates, (after // cfg.log_every + 1) * cfg.log_every]
        if cfg.checkpoint_every:
            ends.append((after // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
        return min(ends)

    def _dispatch(self, s: AnakinState, after: int):
        end = self._boundary(after)
        return (end, *self.chunk_fn(s, end - after))  # returns at once: the program runs in the background

    def _snapshot(self, s: AnakinState, completed: int) -> checkpoint.TrainState:
        # The same TrainState as the sequential loop saves: the lagged sets this run has made so far.
        n = min(completed, self.run.cfg.policy_lag) + 1
        return shared.snapshot(self.run, s.learner, s.actor_params[self.lag - n:], s.compressor, carry=s.carry,
                               normalizer=s.normalizer)

    def steps(self, driver):
        run, seeds = self.run, self.seeds
        if run.plan.resume is None:
            state = replica_states(run)
        else:
            state = restored_state(run, self.skipped.tolist())
        self.state = place_state(run, state)
        completed = run.start_update
        self.shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:] if seeds > 1 else x.shape, x.dtype,
                                                                  weak_type=x.weak_type),
                                   self.state)  # read before the program may take the buffers
        queue = collections.deque()  # dispatched chunks, oldest first: (end, state, out, chunk_end)
        hard_stop = None
        if driver.keep_going(completed):  # the first chunk runs alone: chunks go ahead from its end on
            queue.append(self._dispatch(self.state, completed))
        while queue:
            end, new_state, out, chunk_end = queue.popleft()
            start = time.perf_counter()
            packed, chunk_end = jax.device_get(local_view((out, chunk_end)))  # waits
            done_at = time.perf_counter()
            self.fused_wait += done_at - start
            outs, counters = zip(*(unpack(_seed(packed, k, seeds)) for k in range(seeds)))
            bad_seeds, bad_quantity, skipped = (np.asarray(c) for c in zip(*counters))
            self.skipped = skipped if seeds > 1 else skipped[0]
            bad_update = int(bad_seeds[bad_seeds > 0].min()) if np.any(bad_seeds > 0) else 0  # any seed stops it
            last = (bad_update if bad_update else end) - completed  # updates of this chunk that count
            metrics = [{name: v[last - 1] for name, v in o.metrics.items()} for o in outs]
            self.lag_versions = float(metrics[0].get("policy_lag_versions", np.nan))
            if self.pipelined:
                if hard_stop is None and not bad_update and driver.keep_going(end) and end < run.plan.num_updates:
                    # Pipelined: the next chunk runs (dispatched already when depth 2) while the driver logs
                    # and checkpoints this one (a diverged state is never continued).
                    if not queue:
                        hard_stop = self._dispatch_or_stop(queue, new_state, end) or hard_stop
                    hard_stop = self._speculate(queue) or hard_stop
                else:  # a chunk dispatched ahead that one at a time would not have run: dropped
                    queue.clear()
            self.state, self.chunk_end, completed = new_state, chunk_end, completed + last
            bad = None
            if bad_update:
                seed_k = int(np.argmax(bad_seeds == bad_update))
                bad = Bad(quantity(int(bad_quantity[seed_k])), bad_update, seed_k,
                          MAX_SKIP_STREAK + 1 if run.cfg.on_nan == "skip" else 0)
            refreshed = bool(np.any(packed.refreshed[..., :last]))
            refresh = [_seed(chunk_end, k, seeds).refresh_divergence for k in range(seeds)] if refreshed else None
            # --compressor auto: the decisions taken for the chunks dispatched so far (AutoChunks).
            decisions = self.chunk_fn.control.take_decisions() if run.plan.auto else ()
            yield Step(completed, last, metrics, [chunk_episodes(o, last) for o in outs],
                       None if bad else self._snapshot(new_state, completed), bad, refresh=refresh,
                       events=Events(decisions=decisions), done_at=done_at)
            if hard_stop is not None and not queue:  # the chunks dispatched before it are counted first
                raise hard_stop
            if not self.pipelined and not bad_update and driver.keep_going(end) and end < run.plan.num_updates:
                queue.append(self._dispatch(new_state, end))
        if completed >= run.plan.num_updates:  # the budget is done and logged: count FLOPs beside the run's end
            self._count_flops()

    def _dispatch_or_stop(self, queue, s: AnakinState, after: int):
        """Dispatch the chunk after update ``after`` from ``s`` onto ``queue``; a hard stop (second signal)
        while dispatching is returned, to take effect once the chunks dispatched before it (the finished one
        and, depth 2, the one in flight) are counted: as one chunk at a time would, the run then ends with
        the update before the chunk whose dispatch was stopped."""
        try:
            queue.append(self._dispatch(s, after))
        except KeyboardInterrupt as err:
            return err
        return None

    def _ahead(self, queue) -> bool:
        """Whether to dispatch a chunk ahead (depth 2): one chunk in flight and the budget has another
        (whether it counts is decided when the chunk before it is fetched)."""
        return self.depth == 2 and len(queue) == 1 and queue[-1][0] < self.run.plan.num_updates

    def _speculate(self, queue):
        """Dispatch a chunk ahead where :meth:`_ahead` says so (from the last chunk's state, after its end);
        a hard stop while dispatching is returned as :meth:`_dispatch_or_stop`'s."""
        if not self._ahead(queue):
            return None
        end, state = queue[-1][:2]
        return self._dispatch_or_stop(queue, state, end)

    def _count_flops(self) -> None:
        """Start counting the pieces' FLOPs (:class:`~accerl_jax.loops.pieces.BackgroundFlops`, for the
        summary's cost split) once the budget's last step has been logged: counting traces and lowers the
        pieces, ~0.1-0.6 s of host time that delayed the chunks and rows it ran beside by as much (measured
        on the 2-core CPU when it started with the last chunk's dispatch); now it overlaps only the driver's
        final checkpoint and summary."""
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
        (:func:`~accerl_jax.loops.pieces.has_pieces`). The compression is timed with its rows split over the
        devices, as the program runs it."""
        run = self.run
        if not pieces.has_pieces(run) or self.state is None:
            return {}
        s = _seed(self.state, 0, self.seeds)
        flops = self.flops.result() if self.flops is not None else None
        return pieces.cost_split(run, s.learner, s.actor_params[0], s.compressor, s.carry, timed=run.cfg.cost_split,
                                 flops=flops, split_rows=True)

    def close(self) -> Events:
        # A decision for a chunk dispatched after the last step (a hard stop while dispatching).
        return Events(decisions=self.chunk_fn.control.take_decisions() if self.run.plan.auto else ())
