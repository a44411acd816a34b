"""Policy layer (ψ): the models behind a system's LLM steps, and the operators that train them.

* models — ``tiny`` (tokenizer, config, model), ``pointer`` (the copy-pointer tokenizer), ``hf``
  (Hugging Face checkpoints), ``gguf`` (a ``.gguf`` file as a checkpoint), ``weights`` (base and
  adapter files), ``local`` and ``local_server`` (the ``local`` backend: batched sampling with exact
  log-probs, LoRA adapters selected per call), ``sampling`` (the loop; continuous batching),
  ``batch_cache`` (its KV cache: preallocated layers, rows joining, grouped attention);
* engines (``params.engine``: what samples a local model; ``torch``, the default, is our loop in
  ``sampling``; ``ctranslate2`` is CTranslate2, ``auto`` CTranslate2 where it can) — ``ct2`` (which
  engine, and the converted weights' cache), ``ct2_server`` (the server whose batches CTranslate2
  samples);
* training — ``train`` (SFT and LoRA on the sampler's own token ids), ``precision`` (bf16 or fp32
  training, ``params.precision``), ``sft`` (the cached cold start), ``start`` (how a local model
  starts a run), ``rl`` (GRPO-family estimators and losses), ``grpo_train``;
* operators — ``star`` (rejection sampling, STaR), ``grpo`` (GRPO with LoRA), ``from_traces``
  (SFT on the token ids a served model answered with in rewarded sessions; ``traces`` is its
  deprecated old path).

Heavy libraries are imported inside functions only.
"""
