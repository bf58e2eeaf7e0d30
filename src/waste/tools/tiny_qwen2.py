"""A tiny random Qwen2 checkpoint that vLLM can serve on a CPU: for the remote-engine tests
and bench (README "Scaling out").

``python -m waste.tools.tiny_qwen2 OUT_DIR`` writes a Hugging Face model directory: a random
Qwen2 (2 layers, hidden 128; transformers, seeded), a byte-level BPE ``tokenizer.json``
trained offline with ``tokenizers`` on make_container's corpus, and ``chat.json`` (the
Kimi-Linear example). The vocabulary carries every XTML special, the Kimi-Linear turn
markers and the K2 tool markers, each one special token above the base vocabulary, so the
same model serves both chat formats (XTML by default, the chat.json with ``--chat-format``).
Needs the ``oracle`` extra (torch, transformers). Its words are noise; it proves the path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from waste.tools.make_container import (CORPUS, EXAMPLES, K2_TOOL_MARKERS,
                                        KIMI_LINEAR_SPECIALS, XTML_SPECIALS)

# Qwen2's end of text: transformers' Qwen2Tokenizer (what a qwen2 model's tokenizer loads as)
# adds it when the vocabulary lacks it, past the model's embedding rows.
EOS = "<|endoftext|>"
SPECIALS = XTML_SPECIALS + KIMI_LINEAR_SPECIALS + K2_TOOL_MARKERS + (EOS,)
BASE_VOCAB = 640  # the 256 bytes and the merges trained on the corpus
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 128, 2, 4, 2, 256
MAX_POSITIONS = 8192  # room for the cancellation test's long answer (tests/contract/test_vllm.py)
# Larger than Qwen2's 0.02: well-separated logits, so greedy answers do not hinge on the
# last bits of a batched matmul.
INIT_RANGE = 0.5


def build_tokenizer():
    """The byte-level BPE tokenizer: ``BASE_VOCAB`` ids, then ``SPECIALS`` in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(list(CORPUS) * 4, trainer=trainer)
    n_base = tok.get_vocab_size()
    tok.add_special_tokens(list(SPECIALS))
    for i, text in enumerate(SPECIALS):
        assert tok.token_to_id(text) == n_base + i, f"{text} is not id {n_base + i}"
    return tok


def write_model(out: str | Path, *, seed: int = 0) -> Path:
    """Writes the checkpoint into ``out`` (created; existing files are replaced)."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out)
    config = Qwen2Config(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS,
                         initializer_range=INIT_RANGE, tie_word_embeddings=False,
                         eos_token_id=tok.token_to_id(EOS), bos_token_id=None,
                         dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    chat = json.loads((EXAMPLES / "chat-kimi-linear.json").read_text(encoding="utf-8"))
    (out / "chat.json").write_text(json.dumps(chat, indent=1) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m waste.tools.tiny_qwen2",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the model directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_model(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
