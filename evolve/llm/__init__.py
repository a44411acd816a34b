"""Model backends behind one protocol (:class:`evolve.llm.base.LLM`).

Backends are looked up by name in :data:`evolve.registry.llm_backends` and imported lazily:

* ``litellm`` (:mod:`evolve.llm.litellm`) — every hosted or served model;
* ``scripted`` (:mod:`evolve.llm.fake`) — a fake for plumbing tests, with fault injection;
* ``local`` (:mod:`evolve.policy.local`, in the weights layer) — a Hugging Face causal LM or a
  tiny model built here, with LoRA adapters, dynamic batching and exact log-probs.

:mod:`evolve.llm.params` says which ``params`` each backend takes (checked when a task file
loads) and what must hold before a run starts (an API key in the environment).
"""
