"""Code that runs on a Ray cluster and is not a runner (the ray runner itself is
:mod:`evolve.runners.ray_runner`; it uses these when the task file asks):

* :mod:`~evolve.cluster.model_server` — ``runner.params.model_server``: one actor per local base
  model serves every rollout actor's calls (:class:`~evolve.cluster.model_server.RemoteLLM`), or
  one per model role (``servers: per_role``), each placed with its own resources;
* :mod:`~evolve.cluster.training` — ``runner.params.train``: the SFT cold start and the weight
  operators train in Ray actors with those resources (:class:`~evolve.cluster.training.RayTrainer`);
* :mod:`~evolve.cluster.ray_base` — importing Ray on first use, a cluster's resources and Ray's
  errors in words.

Nothing here imports Ray until it is used; ``pip install 'evolvekit[ray]'`` brings it.
"""
