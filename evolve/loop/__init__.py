"""The evolution loop: f(Π, τ, r) → Π′, one generation at a time, on top of a scoring session.

* ``engine`` — generations: select parents, let operators propose, score, accept, archive;
* ``strategies`` — the loop's small protocols: acceptance, minibatch sampling, stopping;
* ``acceptance`` — two-stage acceptance and re-evaluation; ``selectors``, ``pool`` and ``pareto`` — parents;
* ``operators`` — the Operator protocol every layer implements;
* ``curriculum`` — ``engine.curriculum``: training difficulty and mix that follow the agent's success.

Imports the floors below it (``evolve.deploy`` and ``evolve.trackers`` too, to promote and report what a run
found; ``evolve/__init__.py`` draws them); the layers only through registries.
"""
