"""The steppers: each loop only produces updates and yields :class:`~accerl_jax.run.driver.Step` records;
the :class:`~accerl_jax.run.driver.Driver` owns the run's life around them (docs/DESIGN.md, "One run lifecycle").

* :class:`~accerl_jax.loops.anakin.AnakinStepper` -- the whole update fused in one jitted program, one
  step per chunk of updates.
* :class:`~accerl_jax.loops.sequential.SequentialStepper` -- actor, learner and compressor as separate
  timed jitted calls, one step per update.
* :class:`~accerl_jax.loops.sebulba.SebulbaStepper` -- envpool actor threads, the learner and a
  compressor thread, joined by a bounded queue of versioned rollouts; one step per learner update.
"""
from accerl_jax.loops.anakin import AnakinStepper
from accerl_jax.loops.sebulba import SebulbaStepper
from accerl_jax.loops.sequential import SequentialStepper

STEPPERS = {"anakin": AnakinStepper, "sequential": SequentialStepper, "sebulba": SebulbaStepper}
