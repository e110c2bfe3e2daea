"""Writes a tiny random Llama (weights, config, tokenizer, chat template) that vLLM's CPU build can serve.

No hub access here, so the model is made at test time: a byte-level BPE tokenizer trained on a small
built-in corpus, and a 2-layer Llama with hidden size 128 and 2 heads (head_dim 64: the CPU attention
kernels reject head_dim 16). Run with the Python that has vLLM (and so transformers) installed:
    python tests/e2e/make_tiny_model.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    words = (
        "the a an sea ship story short tell me about hello world request model engine router fleet "
        "token cache prefix sleep wake drain upgrade rollback health ready start stop once upon time"
    ).split()
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12)) + f" {i}")
    return lines


def make(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_tiny_model.py OUTPUT_DIR")
    make(Path(sys.argv[1]))
