"""Write the tiny model directory the Dynamo frontend and mockers load (no model hub needed).

    .venv-dynamo/bin/python deploy/dynamo-local/model/make_model.py   # rewrites the files beside it

The mocker simulates an engine: it needs a tokenizer (to count and decode tokens) and a
`config.json` (its KV bytes per token, from the layer and head counts), never weights. This writes

- `tokenizer.json`: a word-level tokenizer built with the `tokenizers` package: special tokens
  `<unk> <s> </s>`, then `w0 … w{N-1}`, whitespace pre-tokenization, so a prompt of n words
  `w<i>` is exactly n tokens (the load generator relies on that to send a trace's ISL exactly);
- `tokenizer_config.json`, `generation_config.json`, `special_tokens_map.json`;
- `config.json`: the shape of Llama-3.1-8B (32 layers, 8 KV heads of 128), the model the bundled
  H200 profile was measured on, so the mocker's KV cache is sized like that model's; the
  vocabulary is the tiny one.

The files are committed; run this again only to change them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

HERE = Path(__file__).resolve().parent
VOCAB_WORDS = 2048
SPECIAL = ["<unk>", "<s>", "</s>"]


def build_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens(SPECIAL)
    return tok


def main() -> None:
    tok = build_tokenizer()
    tok.save(str(HERE / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 131072,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        # For /v1/chat/completions: the messages' contents, space-separated.
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }
    generation = {"bos_token_id": 1, "eos_token_id": 2}
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for name, obj in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation),
        ("special_tokens_map.json", special),
    ):
        (HERE / name).write_text(json.dumps(obj, indent=2) + "\n")
    print(f"wrote {HERE} (vocabulary {vocab_size})")


if __name__ == "__main__":
    main()
