"""A small Hugging Face checkpoint made offline, as ``save_pretrained`` writes one: a byte-level
BPE tokenizer trained here with a ChatML chat template, and a randomly initialised Qwen2 model.
It stands in for a downloaded instruct checkpoint (config.json, model.safetensors, tokenizer files,
generation_config.json), so the pretrained path is tested end to end without a download."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "select name from users where age > 30",
    "the quick brown fox jumps over the lazy dog",
    "aeiou aa ee ii oo uu more vowels please",
    "user assistant system tool result error",
] * 20


def make_checkpoint(
    path: Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int | None = None,
) -> Path:
    """Write the checkpoint; ``vocab`` pads the model's vocabulary beyond the tokenizer's (as Qwen's
    151,936 rows pad its tokenizer), e.g. to reach the inverse-CDF sampler."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=360, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(
        vocab_size=max(vocab or 0, len(tok)),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=im_end,
        pad_token_id=eot,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot).save_pretrained(path)
    return path
