"""Model backends behind one protocol (:class:`evolve.llm.base.LLM`).

Backends are looked up by name in :data:`evolve.registry.llm_backends` and imported lazily:
``local`` (a Hugging Face causal LM with LoRA adapters), ``litellm`` (every hosted or served
model), ``scripted`` (a fake for plumbing tests).
"""
