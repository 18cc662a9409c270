"""``--compressor auto``: choose the actor's compression, and change it while training.

The paper fixes one compressor per run. ``auto`` holds a fixed list of candidate compressors (default
:data:`DEFAULT_CANDIDATES`) and runs the *fastest one whose divergence from the learner stays under a
bound* (``--max-actor-kl``), re-deciding while training. One *evaluation*:

1. speed: seconds per forward pass of the actor's batch ``B``, compiled as the actor runs it
   (``forward_timer``, :func:`accerl_jax.platform.speed.forward_timer`), measured once per candidate, at the first
   evaluation -- the cost depends on the network's shapes and dtypes, not on its weight values, so a
   candidate not yet built is timed on zeros of its actor parameters' shapes -- interleaved over
   ``rounds`` rounds (median), together with the learner's own network (``speedup_vs_none``);
2. divergence: KL(π_learner ‖ π_candidate) (nats) and greedy-action agreement on up to ``samples``
   current observations (the ``divergence`` function the Monitor uses), first of the running candidate
   (its actor parameters are fresh), then of the candidates that can change the choice: if the running
   one is within the bound, only the faster ones; else every other. They are *warmed* fastest first --
   ``warmup`` calls of their own ``compress`` from the current learner parameters on the current
   observations (a candidate's ``init`` runs at its first warm-up) -- and the first within the bound
   ends the evaluation, since it is the choice. Every candidate's state is kept between evaluations, so
   distillation students resume where they stopped rather than starting again;
3. choice: the fastest candidate with KL ≤ ``max_kl``; if none qualifies, the one with the smallest KL
   (the most faithful). When no candidate can change the choice (the running one is the fastest within
   the bound), nothing is warmed: the evaluation is *skipped*, counts as done, and returns no decision
   (``skipped_evaluations`` counts them). Between evaluations only the running candidate's ``compress`` runs.

An evaluation starts when the running policy's KL exceeds ``max_kl`` (trigger ``divergence``), the
fraction of the rollout's importance ratios ρ = π(a|x)/μ(a|x) above ρ̄ · :data:`CLIP_MARGIN` exceeds
``max_clip_fraction`` (``clipping``; ρ̄ = ``clip_rho_threshold``, π the learner parameters that computed
the update), ``every`` updates have passed since the last one (``periodic``), or none has run yet
(``initial``). A trigger fires only once ``cooldown`` updates have passed since the last evaluation:
``check_every`` at first and after a switch, doubled (up to ``every``) each time a triggered evaluation
keeps the running candidate (otherwise the clipping trigger can fire at nearly every check while the
choice stands, and the evaluations dominate the run's time). Each evaluation returns a *decision* (a dict: trigger, chosen and previous
candidate, whether it switched, a one-line ``reason``, the candidates ``evaluated`` and their
measurements), which the loop yields in its next step for the driver to log.

One loop hook, :meth:`AutoCompressor.adapt`, called by every loop through the same wiring
(:class:`accerl_jax.loops.auto.AutoControl`) after the running candidate's compression: the sequential
loop once per learner update, the Sebulba compressor thread after each learner version it compresses
(the triggers measured every ``check_every`` updates, on the update's rollout:
:meth:`AutoCompressor.rollout_measure`), the Anakin loop at chunk boundaries (the triggers' statistics
measured inside the chunk's program: :meth:`AutoCompressor.clip_fractions`, and the KL of the freshest
policy; one compiled chunk program per candidate, :meth:`AutoCompressor.candidate`,
:class:`accerl_jax.loops.anakin_auto.AutoChunks`).

Actor parameters are ``{candidate key: that candidate's actor params}`` with a single entry, so switching
changes the pytree's structure; :meth:`AutoCompressor.actor_apply` dispatches on that key at trace time,
and jitted actors compile once per candidate they meet. Keys are the candidate specs with ``:`` and
``+`` written as ``_`` and ``-`` (checkpoint-safe names). ``--resume`` of a run that ran these candidates
is refused (the structure of the saved actor parameters depends on the decisions taken;
:func:`accerl_jax.run.plan.make_plan`); one whose cost-split gate resolved auto to one compressor before
training (:mod:`accerl_jax.run.auto_gate`) resumes as that compressor's run.

``init`` and the candidates' ``compress`` are pure (each candidate's init key is kept in the
:class:`AutoState`); the host-side decisions read device values. With several processes, every
measurement a decision depends on goes through ``agree`` (process 0's values), so all processes decide alike.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import networks
from accerl_jax.platform import xla
from accerl_jax.compressor.base import Compressor
from accerl_jax.corrector import CLIP_MARGIN  # the clipping trigger counts ρ > ρ̄ · CLIP_MARGIN
from accerl_jax.types import ApplyFn, Rollout

DEFAULT_CANDIDATES = ("none", "int8", "distill:tiny", "distill:small", "distill:small+int8", "prune:0.5+distill")
TRIGGERS = ("initial", "divergence", "clipping", "periodic")


class AutoState(NamedTuple):
    current: jax.Array  # [] int32, index of the running candidate in AutoCompressor.candidates
    last_evaluation: jax.Array  # [] int32, learner update of the last evaluation (-1: none yet)
    cooldown: jax.Array  # [] int32, updates after the last evaluation before a trigger may start another
    states: dict  # candidate key -> that candidate's compressor state (every candidate, kept between evaluations)
    init_keys: jax.Array  # [candidates, 2] uint32, the PRNG key of each candidate's init (split from init's key)


def candidate_key(spec: str) -> str:
    """The pytree/checkpoint key of a candidate spec: ``distill:small+int8`` -> ``distill_small-int8``."""
    return spec.replace(":", "_").replace("+", "-")


def parse_candidates(text: str | Sequence[str]) -> list[str]:
    """Split a comma-separated ``--auto-candidates`` list.

    Raises:
      ValueError: empty list, an empty entry, a repeated entry, or ``auto`` itself among them.
    """
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    if not items or not all(items):
        raise ValueError(f"bad --auto-candidates {text!r}: an empty entry; expected a comma-separated list of "
                         f"--compressor specs, e.g. {','.join(DEFAULT_CANDIDATES)!r}")
    if "auto" in items:
        raise ValueError(f"bad --auto-candidates {text!r}: 'auto' cannot be its own candidate")
    repeated = sorted({s for s in items if items.count(s) > 1})
    if repeated:
        raise ValueError(f"bad --auto-candidates {text!r}: {', '.join(repeated)} listed more than once")
    return items


class AutoCompressor:
    """A Compressor-like object (``init``/``compress``/``actor_apply``) plus the loop hook :meth:`adapt`.

    Args:
      candidates: ``(spec, Compressor)`` pairs, built by :func:`accerl_jax.compressor.make_compressor`;
        the first runs until the first evaluation.
      teacher_apply: the learner network's apply function.
      family: network family (``"mlp"``, ``"cnn"``, ...), for the compiler options of the jitted functions.
      divergence: ``(learner_out [N, A], actor_out [N, A]) -> {"kl_learner_actor", "action_agreement"}``.
      forward_timer: ``apply -> timer(params, obs_seq [K, B, ...]) -> seconds per forward``.
      max_kl: the bound on KL(π_learner ‖ π_actor), nats (> 0).
      every: re-evaluate at least every this many learner updates.
      check_every: measure the triggers every this many learner updates.
      max_clip_fraction: re-evaluate when more than this fraction of the rollout's ρ exceed ρ̄ · CLIP_MARGIN.
      clip_rho_threshold: ρ̄.
      warmup: ``compress`` calls each non-running candidate makes at an evaluation.
      samples: observations the divergence is measured on.
      speed_forwards, rounds: forward passes per timed scan; interleaved timing rounds.
      agree: ``pytree of host numbers -> pytree``, applied to every measurement a decision depends on
        (timings, KL, agreement, clipping) before it is used. The identity for one process; with several
        processes, process 0's values broadcast to all (:func:`accerl_jax.run.distributed.agree`), so that
        every process takes the same decisions and warms the same candidates on the same (global)
        observations, and their actors stay identical.

    ``timed_stages`` is empty, as :class:`~accerl_jax.compressor.base.Compressor`'s: auto's time is all
    compression. ``takes_teacher`` is False: its distilling candidates run their own teacher pass.
    """

    timed_stages: tuple = ()
    takes_teacher: bool = False

    def __init__(self, candidates: Sequence[tuple[str, Compressor]], teacher_apply: ApplyFn, *, family: str,
                 divergence: Callable, forward_timer: Callable, max_kl: float, every: int = 100,
                 check_every: int = 10, max_clip_fraction: float = 0.2, clip_rho_threshold: float = 1.0,
                 warmup: int = 4, samples: int = 256, speed_forwards: int = 8, rounds: int = 3,
                 agree: Callable = lambda tree: tree):
        if not candidates:
            raise ValueError("auto needs at least one candidate compressor")
        self.specs = [s for s, _ in candidates]
        self.keys = [candidate_key(s) for s in self.specs]
        self.candidates = [c for _, c in candidates]
        self.teacher_apply = teacher_apply
        self.divergence = divergence
        self.max_kl, self.every, self.check_every = float(max_kl), int(every), int(check_every)
        self.max_clip_fraction, self.clip_rho_threshold = float(max_clip_fraction), float(clip_rho_threshold)
        self.warmup, self.samples, self.speed_forwards, self.rounds = warmup, samples, speed_forwards, rounds
        self.agree = agree
        self._applies = [c.actor_apply(teacher_apply) for c in self.candidates]
        self._logits = [xla.jit(lambda p, o, a=a: a(p, o)[0], family) for a in self._applies]
        self._learner_logits = xla.jit(lambda p, o: teacher_apply(p, o)[0], family)
        self._timers = [forward_timer(a) for a in self._applies]
        self._base_timer = forward_timer(teacher_apply)
        self.forward_s: dict[str, float] = {}  # candidate spec -> measured seconds per forward (cache)
        self.base_forward_s: float | None = None
        self.decisions: list[dict] = []

        self.skipped_evaluations = 0  # evaluations that had nothing to gain (see _evaluate)
        self._clip_fraction = xla.jit(self.clip_fractions, family)

    def clip_fractions(self, params, rollout: Rollout) -> tuple[jax.Array, jax.Array]:
        """Traceable: the shares of ``rollout``'s valid steps with ρ > ρ̄ and with ρ > ρ̄ · :data:`CLIP_MARGIN`
        ([] float32 each), ρ = π(a|x)/μ(a|x) with π the learner network at ``params``."""
        continuous = jnp.issubdtype(rollout.action.dtype, jnp.floating)
        out = self.teacher_apply(params, rollout.obs)[0]
        log_pi = networks.policy_distribution(out, bool(continuous)).log_prob(rollout.action)
        rho = jnp.exp(log_pi - rollout.log_prob)
        count = jnp.maximum(jnp.sum(rollout.valid), 1)
        clipped = jnp.sum((rho > self.clip_rho_threshold) & rollout.valid) / count
        beyond = jnp.sum((rho > self.clip_rho_threshold * CLIP_MARGIN) & rollout.valid) / count
        return clipped, beyond

    # --- the Compressor interface -------------------------------------------------------------------
    def init(self, params, key, obs=None):
        """The first candidate's actor params and state; the others' states are None until an evaluation
        first warms them (:meth:`_warm`: their ``init`` then runs on the learner's parameters of that
        time, each with its own key split from ``key`` and kept in the state). Pure (traceable).
        Returns ``(actor_params, AutoState)``."""
        init_keys = jax.random.split(key, len(self.keys))
        p, first = self._init(0, params, obs, init_keys[0])
        states = {k: first if i == 0 else None for i, k in enumerate(self.keys)}
        return {self.keys[0]: p}, AutoState(jnp.int32(0), jnp.int32(-1), jnp.int32(self.check_every), states, init_keys)

    def _init(self, i: int, params, obs, key):
        """Candidate ``i``'s ``init`` (with ``obs`` when given)."""
        c = self.candidates[i]
        return c.init(params, key) if obs is None else c.init(params, key, obs)

    def compress(self, params, state: AutoState, obs):
        """The running candidate's ``compress``; the other candidates' states are left as they are."""
        i = int(state.current)
        k = self.keys[i]
        p, s = self.candidates[i].compress(params, state.states[k], obs)
        return {k: p}, state._replace(states={**state.states, k: s})

    def actor_apply(self, apply: ApplyFn) -> ApplyFn:
        """An apply function for any candidate's actor params, chosen by their single key (at trace time)."""
        applies = dict(zip(self.keys, (c.actor_apply(apply) for c in self.candidates)))

        def dispatch(actor_params, obs):
            (k, p), = actor_params.items()
            return applies[k](p, obs)

        return dispatch

    # --- the loop hooks -------------------------------------------------------------------------------
    def candidate(self, i: int) -> Compressor:
        """Candidate ``i`` on its own, as a Compressor whose actor params are ``{its key: params}`` (what
        :meth:`actor_apply` dispatches on) and whose state is the candidate's own entry of
        ``AutoState.states``. The Anakin loop compiles one chunk program per candidate with it."""
        k, c = self.keys[i], self.candidates[i]

        def init(params, key, obs=None):
            p, s = self._init(i, params, obs, key)
            return {k: p}, s

        def compress(params, state, obs):
            p, s = c.compress(params, state, obs)
            return {k: p}, s

        return Compressor(init=init, compress=compress, actor_apply=self.actor_apply)

    def running(self, state: AutoState) -> str:
        return self.specs[int(state.current)]

    def summary(self, state: AutoState) -> dict:
        """The run summary's auto fields: every decision taken, the candidate running in ``state``, and
        the evaluations skipped as having nothing to gain."""
        return {"auto_decisions": list(self.decisions), "auto_running": self.running(state),
                "auto_skipped_evaluations": self.skipped_evaluations}

    def check_due(self, update: int, state: AutoState) -> bool:
        """True when the triggers may fire after ``update``: an evaluation has run and ``cooldown`` updates
        have passed since the last one."""
        last = int(state.last_evaluation)
        return last >= 0 and update - last >= int(state.cooldown)

    def _trigger(self, update: int, state: AutoState, measured: dict) -> str | None:
        """The trigger that fires after ``update`` given the running policy's ``measured`` ``kl`` and
        ``clip_fraction_margin`` (empty: not measured this time), or None."""
        last = int(state.last_evaluation)
        if last < 0:
            return "initial"
        if update - last >= self.every:
            return "periodic"
        if not measured:
            return None
        if measured["kl"] > self.max_kl:
            return "divergence"
        if measured["clip_fraction_margin"] > self.max_clip_fraction:
            return "clipping"
        return None

    def adapt(self, update: int, params, state: AutoState, actor_params, obs, measure: Callable[[bool], dict],
              since: int | None = None):
        """The one hook of every loop (:class:`accerl_jax.loops.auto.AutoControl`), called after the
        running candidate's compression: check the triggers and, when one fires, evaluate the candidates
        (:meth:`_evaluate`) and choose.

        The running policy's statistics are asked of ``measure`` only when a trigger may need them: with
        ``kl=True`` when the triggers are checked (the cooldown has passed, and a multiple of
        ``check_every`` lies in ``(since, update]``), with ``kl=False`` for the record of a decision whose
        trigger needed none (``initial``, ``periodic``).

        Args:
          update: the learner update just completed (1-based; 0: before the first, the Anakin loop's
            first chunk, when only ``initial`` can fire).
          params: the learner parameters after it; ``actor_params`` (``{key: params}`` of the running
            candidate) were compressed from them or from a recent version (``--compress-every``).
          obs: ``[K, B, *obs_shape]`` the observations to measure and warm on (the last rollout's, or
            ``K = 1`` reset ones; with several processes the global batch's, so that every process warms
            its candidates alike).
          measure: ``kl -> {"kl", "clip_fraction", "clip_fraction_margin"}`` of the running policy (KL
            (π_learner ‖ π_running) in nats, and the ρ clipping of the last update's rollout; ``kl``
            False: the KL may be left out); {} where nothing is measured (before the first update).
          since: the update of the previous call (the Sebulba compressor thread skips versions);
            default ``update - 1``; ``update - check_every`` makes every call a check (the Anakin loop's
            chunk boundaries).

        Returns:
          ``(actor_params, state, decision)``; ``decision`` is None when no evaluation ran (or it was
          skipped as having nothing to gain).
        """
        since = update - 1 if since is None else since
        trigger, measured = self._trigger(update, state, {}), {}
        if trigger is None and update // self.check_every > since // self.check_every and self.check_due(update, state):
            measured = measure(True)
            measured = self.agree(measured) if measured else measured
            trigger = self._trigger(update, state, measured)
        if trigger is None:
            return actor_params, state, None
        if not measured:
            measured = measure(False)
            measured = self.agree(measured) if measured else measured
        return self._evaluate(update, params, state, actor_params, obs, trigger, measured)

    def rollout_measure(self, params, actor_params, state: AutoState, rollout: Rollout, obs=None,
                        rho_params=None) -> Callable[[bool], dict]:
        """:meth:`adapt`'s ``measure`` from a ``[T, B]`` ``rollout`` (the sequential and Sebulba loops): KL
        of the running candidate's ``actor_params`` on up to ``samples`` of ``obs`` (default
        ``rollout.obs``), and the ρ clipping of the rollout with π the learner at ``rho_params`` (the
        parameters the update computed ρ with; default ``params``)."""
        obs = rollout.obs if obs is None else obs
        rho_params = params if rho_params is None else rho_params

        def measure(kl: bool) -> dict:
            if not kl:
                return self._clipping(rho_params, rollout)
            held = obs.reshape((-1,) + obs.shape[2:])[: self.samples]
            i = int(state.current)
            div = self.divergence(self._learner_logits(params, held), self._logits[i](actor_params[self.keys[i]], held))
            return {"kl": float(div["kl_learner_actor"]), **self._clipping(rho_params, rollout)}

        return measure

    def _clipping(self, params, rollout) -> dict:
        """``clip_fraction``: share of valid steps with ρ > ρ̄ (clipped by the learner);
        ``clip_fraction_margin``: with ρ > ρ̄ · :data:`CLIP_MARGIN` (the trigger's statistic)."""
        clipped, beyond = self._clip_fraction(params, rollout)
        return {"clip_fraction": float(clipped), "clip_fraction_margin": float(beyond)}

    def _evaluate(self, update, params, state: AutoState, actor_params, obs, trigger, measured):
        """Evaluate the candidates that can change the choice on ``obs [K, B, ...]`` and choose.

        Once every candidate's speed is known and the running one is within the bound, only the candidates
        faster than it can be chosen, so only those are warmed and measured; when there are none (the
        running candidate is the fastest within the bound), nothing is evaluated, the evaluation counts as
        done (``last_evaluation`` = ``update``), ``skipped_evaluations`` goes up and the decision is None.
        """
        obs_flat = obs.reshape((-1,) + obs.shape[2:])
        held = obs_flat[: self.samples]
        learner_out = self._learner_logits(params, held)
        current = int(state.current)
        running = self.specs[current]
        states = dict(state.states)
        rows: dict[str, dict] = {}
        fresh = {current: actor_params[self.keys[current]]}

        def measure(i: int) -> None:
            div = self.divergence(learner_out, self._logits[i](fresh[i], held))
            rows[self.specs[i]] = self.agree({"kl": float(div["kl_learner_actor"]),
                                              "agreement": float(div["action_agreement"])})

        measure(current)
        if not all(s in self.forward_s for s in self.specs):  # the first evaluation: time every candidate
            reps = -(-self.speed_forwards // obs.shape[0])  # reset observations ([1, B]) are repeated
            self._time(params, fresh, obs_flat, jnp.concatenate([obs] * reps)[: self.speed_forwards])
        if rows[running]["kl"] <= self.max_kl:
            # The running candidate qualifies: only a faster one can be chosen instead.
            todo = [i for i, s in enumerate(self.specs) if self.forward_s[s] < self.forward_s[running]]
        else:
            todo = [i for i in range(len(self.specs)) if i != current]
        cooldown = int(state.cooldown)
        if trigger in ("divergence", "clipping"):  # unless it switches below: the trigger fired, the choice stood
            cooldown = min(2 * cooldown, self.every)
        if not todo:
            self.skipped_evaluations += 1
            return actor_params, state._replace(last_evaluation=jnp.int32(update), cooldown=jnp.int32(cooldown),
                                                states=states), None
        # Fastest first: the first within the bound is the choice, so the slower ones are never warmed.
        for i in sorted(todo, key=lambda i: self.forward_s[self.specs[i]]):
            fresh[i], states[self.keys[i]] = self._warm(i, params, states[self.keys[i]], obs_flat, state.init_keys[i])
            measure(i)
            if rows[self.specs[i]]["kl"] <= self.max_kl:
                break
        for spec, row in rows.items():
            row["forward_s"] = self.forward_s[spec]
            row["speedup_vs_none"] = self.base_forward_s / self.forward_s[spec]
            row["within_bound"] = row["kl"] <= self.max_kl
        evaluated = [s for s in self.specs if s in rows]
        eligible = [s for s in evaluated if rows[s]["within_bound"]]
        if eligible:
            chosen = min(eligible, key=lambda s: rows[s]["forward_s"])
            faster = [s for s in evaluated if rows[s]["forward_s"] < rows[chosen]["forward_s"]]
            reason = (f"{chosen} is the fastest with KL {rows[chosen]['kl']:.3g} <= {self.max_kl:g} "
                      f"({rows[chosen]['speedup_vs_none']:.2f}x the learner's forward speed)")
            if faster:
                reason += "; faster but over the bound: " + ", ".join(f"{s} (KL {rows[s]['kl']:.3g})" for s in faster)
        else:
            chosen = min(evaluated, key=lambda s: rows[s]["kl"])
            reason = (f"no candidate has KL <= {self.max_kl:g}; {chosen} is the most faithful "
                      f"(KL {rows[chosen]['kl']:.3g})")
        slower = [s for s in self.specs if s not in rows]
        if slower:
            reason += f"; not evaluated (slower than {chosen}, which is within the bound): {', '.join(slower)}"
        why = {"initial": "first evaluation",
               "periodic": f"{self.every} updates since the last evaluation",
               "divergence": f"running {running} measured KL {measured.get('kl', float('nan')):.3g} > "
                             f"{self.max_kl:g}",
               "clipping": f"{measured.get('clip_fraction_margin', float('nan')):.1%} of rho above "
                           f"{CLIP_MARGIN:g} x {self.clip_rho_threshold:g} > {self.max_clip_fraction:.1%}"}[trigger]
        j = self.specs.index(chosen)
        switched = j != current
        if switched:
            cooldown = self.check_every
        decision = {
            "update": int(update), "trigger": trigger, "chosen": chosen, "chosen_index": j, "previous": running,
            "switched": switched, "reason": f"{why}: {reason}" + ("" if switched else " (kept)"),
            "max_actor_kl": self.max_kl, "measured": measured, "candidates": rows, "evaluated": evaluated,
            "next_trigger_cooldown": cooldown,
        }
        self.decisions.append(decision)
        new_state = state._replace(current=jnp.int32(j), last_evaluation=jnp.int32(update),
                                   cooldown=jnp.int32(cooldown), states=states)
        return {self.keys[j]: fresh[j]}, new_state, decision

    def _warm(self, i: int, params, state, obs_flat, key):
        """Candidate ``i``'s actor params after ``warmup`` ``compress`` calls from ``state`` (its first
        ``init``, with ``key``, when None). Returns ``(actor_params, state)``."""
        if state is None:
            p, state = self._init(i, params, obs_flat, key)
        for _ in range(self.warmup):
            p, state = self.candidates[i].compress(params, state, obs_flat)
        return p, state

    def forward_seconds(self, params, obs_seq) -> dict[str, float]:
        """Seconds per forward pass of every candidate (and ``base_forward_s``, the learner's), timed as at
        the first evaluation (:meth:`_time`: compiled as the actor runs it, on zeros of each candidate's
        actor parameters, interleaved, median of ``rounds``) on ``obs_seq [K, B, *obs_shape]``; cached.
        Only the shapes and dtypes of ``params`` (the learner's) and ``obs_seq`` matter to the time.

        Returns:
          candidate spec -> seconds per forward, in the order of :attr:`specs`.
        """
        self._time(params, {}, obs_seq.reshape((-1,) + obs_seq.shape[2:]), obs_seq)
        return {s: self.forward_s[s] for s in self.specs}

    def _time(self, params, fresh: dict, obs_flat, obs_seq) -> None:
        """Measure the forward seconds of candidates not timed yet (and the learner's), interleaved, on
        ``obs_seq [K, B, ...]``. ``fresh``: candidate index -> actor params; a candidate not in it is timed
        on zeros of its actor params' shapes and dtypes (the time depends on those, not on the values), so
        that timing compiles only its forward pass."""
        todo = [i for i, s in enumerate(self.specs) if s not in self.forward_s]
        if not todo:
            return
        fresh = dict(fresh)
        for i in todo:
            if i not in fresh:
                shapes = jax.eval_shape(lambda p, i=i: self._init(i, p, obs_flat, jax.random.PRNGKey(0))[0], params)
                fresh[i] = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        times: dict[int, list] = {i: [] for i in todo}
        base: list = []
        for _ in range(self.rounds):
            if self.base_forward_s is None:
                base.append(self._base_timer(params, obs_seq))
            for i in todo:
                times[i].append(self._timers[i](fresh[i], obs_seq))
        measured = self.agree({"base": float(np.median(base)) if base else -1.0,
                               "candidates": [float(np.median(times[i])) for i in todo]})
        if base:
            self.base_forward_s = measured["base"]
        for i, seconds in zip(todo, measured["candidates"]):
            self.forward_s[self.specs[i]] = seconds


def auto(candidates: Sequence[str], network: networks.NetworkSpec, teacher_apply: ApplyFn, make: Callable,
         **kwargs) -> AutoCompressor:
    """Build an :class:`AutoCompressor` over ``candidates`` (``--compressor`` specs).

    ``make(spec) -> Compressor`` builds one candidate (e.g. :func:`accerl_jax.compressor.make_compressor`
    with the run's distillation settings); ``kwargs`` go to :class:`AutoCompressor`.

    Raises:
      ValueError: a bad candidate list or spec (the message names it).
    """
    specs = parse_candidates(candidates)
    return AutoCompressor([(s, make(s)) for s in specs], teacher_apply, family=network.family, **kwargs)
