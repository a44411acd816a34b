"""Policy layer (ψ): the models behind a system's LLM steps, and the operators that train them.

* models — ``tiny`` (tokenizer, config, model), ``pointer`` (the copy-pointer tokenizer), ``hf``
  (Hugging Face checkpoints), ``weights`` (base and adapter files), ``local`` and ``local_server``
  (the ``local`` backend: batched sampling with exact log-probs, LoRA adapters selected per call),
  ``sampling``;
* training — ``train`` (SFT and LoRA on the sampler's own token ids), ``sft`` (the cached cold
  start), ``start`` (how a local model starts a run), ``rl`` (GRPO-family estimators and losses),
  ``grpo_train``;
* operators — ``star`` (rejection sampling, STaR), ``grpo`` (GRPO with LoRA), ``traces``
  (``from_traces``: SFT on the token ids a served model answered with in rewarded sessions).

Heavy libraries are imported inside functions only.
"""
