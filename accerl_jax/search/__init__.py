"""Search agents (``--agent search``): Gumbel MuZero search (Danihelka et al. 2022, "Policy improvement
by planning with Gumbel", https://openreview.net/forum?id=bERaNdoegnO) with DeepMind's ``mctx`` at every
env step, run with the *actor's* (compressed) network and the environment's own gymnax ``step`` as the
model; the learner trains the full-precision network on the search's action weights and n-step value
targets.

* :mod:`accerl_jax.search.acting` -- the search at one env step and the actor that runs it in the Anakin
  loop (:class:`~accerl_jax.search.acting.SearchActor`, rollouts :class:`~accerl_jax.search.acting.SearchRollout`).
* :mod:`accerl_jax.search.targets` -- n-step value targets and the learner's loss (``loss="search"``).

Imports point one way: this package imports the actor, learner and env adapters, none of them imports it
at module level (the learner picks the loss with a local import).
"""
