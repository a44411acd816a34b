"""Policy layer (ψ): tiny local models built from a config, SFT cold start, STaR with LoRA.

``tiny`` (tokenizer, config, model), ``weights`` (base/adapter files), ``train`` (SFT and LoRA
training on the sampler's own token ids), ``sft`` (the cached cold start), ``star`` (the
rejection-sampling operator). Heavy libraries are imported inside functions only.
"""
