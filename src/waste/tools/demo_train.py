"""Trains the embedded demo model: a ~2 M-parameter Kimi-Linear that speaks XTML.

``python -m waste.tools.demo_train OUT_DIR [--seed S] [--resume] [--stop-at N]`` builds the
vocabulary with the project's BPE trainer, trains on ``demo_data`` conversations (loss only on
what the model writes) in two step-based phases (``SCHEDULE``, then ``POLISH`` for the word
tasks), checkpoints to OUT_DIR/work/ (``--resume`` continues across the phases), and writes a
Hugging Face checkpoint in bf16 (config.json, model.safetensors, tiktoken.model,
tokenizer_config.json) plus manifest.json, ready for ``waste.tools.convert``. Deterministic for
a seed on one machine; needs the ``oracle`` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import tiktoken
import torch
import transformers

from waste.tools import demo_data
from waste.tools.bpe_train import KIMI_PAT, train_ranks, write_tiktoken_file
from waste.tools.demo_domain import XTML_MARKERS, parse_reply, prompt_segments, reply_segments
from waste.tools.demo_kda import install as install_fast_kda
from waste.tools.make_container import EOS, XTML_SPECIALS

VOCAB = 1024
SPECIALS = XTML_SPECIALS + (EOS,)
CORPUS_CONVERSATIONS = 3000

# hidden 128; KDA, KDA, MLA, KDA; layer 0 dense, then 8 routed experts (top 2) + 1 shared.
MODEL: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    intermediate_size=384, moe_intermediate_size=128, num_local_experts=8, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.446, norm_topk_prob=True,
    linear_num_heads=2, linear_head_dim=64, linear_conv_kernel_dim=4,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    tie_word_embeddings=False, rms_norm_eps=1e-5, model_max_length=4096,
)

# One schedule: AdamW, linear warmup to ``lr`` over ``warmup`` steps, then a cosine down to
# ``min_lr_ratio`` × lr at the last step; ``per_batch`` conversations a step (~4.6 k tokens).
SCHEDULE: dict[str, Any] = dict(steps=3600, per_batch=16, lr=3e-3, warmup=50, min_lr_ratio=0.05,
                                betas=(0.9, 0.95), weight_decay=0.05, clip=1.0, bias_rate=1e-3)
# A second phase, from where the first ends (its weights and AdamW moments): the same mixture,
# but the made-up words made of the vocabulary's letter pieces (demo_data.piece_word)
# and the reversed or upper-cased answer written one letter a token (``encode``). After the
# first phase alone the word tasks failed on held-out words whose pieces are rare (a copy of the
# word from its own guesses instead of the prompt) and on gluing letters back into pieces.
POLISH: dict[str, Any] = dict(steps=1600, lr=1e-3, warmup=20, min_lr_ratio=0.05)


# -- tokenizer -------------------------------------------------------------------------------

def build_vocabulary(seed: int) -> dict[bytes, int]:
    """BPE ranks (256 bytes + merges) so that ranks + specials make ``VOCAB`` ids."""
    texts = list(demo_data.corpus_texts(seed, CORPUS_CONVERSATIONS))
    return train_ranks(texts, VOCAB - len(SPECIALS) - 256)


class Tok:
    """tiktoken over the trained ranks, with the XTML markers as special tokens (ids after
    the ranks, in ``SPECIALS`` order, as the converter reads them)."""

    def __init__(self, ranks: dict[bytes, int]) -> None:
        self.n_base = len(ranks)
        self.special_ids = {s: self.n_base + i for i, s in enumerate(SPECIALS)}
        self.enc = tiktoken.Encoding("waste-demo", pat_str=KIMI_PAT, mergeable_ranks=ranks,
                                     special_tokens=self.special_ids)
        self.markers = tuple(self.special_ids[m] for m in XTML_MARKERS)

    def segments(self, segs) -> list[int]:
        ids: list[int] = []
        for seg in segs:  # docs/XTML.md §1: each segment encoded on its own
            if seg.markup:
                ids.append(self.special_ids[seg.text])
            else:
                ids += self.enc.encode_ordinary(seg.text)
        return ids

    def piece(self, token: int) -> bytes:
        return self.enc.decode_single_token_bytes(token)


def letter_pieces(tok: Tok) -> demo_data.LetterPieces:
    """The vocabulary's lower-case letter pieces (with or without their leading space) and
    its cut of a word, for ``demo_data.piece_word``."""
    words = tuple(sorted(tok.piece(i).decode() for i in range(tok.n_base)
                         if re.fullmatch(rb" ?[a-z]+", tok.piece(i))))
    return demo_data.LetterPieces(
        words, lambda text: [tok.piece(i).decode() for i in tok.enc.encode_ordinary(text)])


def _spelled(tok: Tok, text: str, answer: str) -> list[int]:
    """``text`` encoded with each `` {answer}.`` in it written one byte a token (the same text
    as its canonical encoding: the server reads text, not ids)."""
    ids: list[int] = []
    parts = text.split(f" {answer}.")
    for k, part in enumerate(parts):
        ids += tok.enc.encode_ordinary(part)
        if k < len(parts) - 1:
            ids += [tok.enc.encode_single_token(bytes([b])) for b in f" {answer}".encode()]
            ids += tok.enc.encode_ordinary(".")
    return ids


def encode(tok: Tok, ex: demo_data.Example, *, spelled_answers: bool = False) -> tuple[list[int], int]:
    """(prompt + reply ids, prompt length); checks that the reply parses back by token. With
    ``spelled_answers`` a word task's answer (the reversed or upper-cased word) is written one
    letter a token, which the model then copies from its spelled-out reasoning."""
    prompt, thinking = prompt_segments(ex.body)
    reply = reply_segments(ex.reply.message(), thinking=thinking)
    p = tok.segments(prompt)
    if spelled_answers and ex.family in demo_data.WORD_TASKS:
        answer = ex.reply.content.rsplit(" ", 1)[1].rstrip(".")
        r = []
        for seg in reply:
            r += [tok.special_ids[seg.text]] if seg.markup else _spelled(tok, seg.text, answer)
    else:
        r = tok.segments(reply)
    message, ended = parse_reply(r, tok.piece, tok.markers, thinking=thinking)
    if not ended or demo_data.grade(ex, message) != (True, True):
        raise AssertionError(f"a training reply does not parse back: {message}")
    return p + r, len(p)


def write_tokenizer(tok: Tok, ranks: dict[bytes, int], out: Path) -> None:
    write_tiktoken_file(ranks, out / "tiktoken.model")
    dec = {str(i): {"content": s, "special": True} for s, i in tok.special_ids.items()}
    (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": dec}, indent=1) + "\n")


# -- batches ---------------------------------------------------------------------------------

def pad_rows(rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels (-100 outside the reply: loss only on generated tokens).
    ``labels[t]`` is ``ids[t]`` where the model writes it; logits at t - 1 predict it."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (seq, n_prompt) in enumerate(rows):
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, n_prompt:len(seq)] = torch.tensor(seq[n_prompt:])
    return ids, labels


def batch_of(tok: Tok, examples, *, spelled_answers: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_rows([encode(tok, ex, spelled_answers=spelled_answers) for ex in examples])


def step_batch(tok: Tok, seed: int, step: int, per_batch: int,
               pieces: demo_data.LetterPieces | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch. Steps come in blocks of ``BLOCK``: a block's conversations are
    sorted by length and cut into ``BLOCK`` batches of ``per_batch`` (little padding, and every
    drawn conversation is used, so length does not bias the mixture), in a seeded order. With
    ``pieces`` (the second phase): piece words and spelled answers."""
    block, slot = divmod(step, BLOCK)
    key = (seed, block, per_batch, pieces is not None)
    if _BLOCK_CACHE.get("key") != key:
        pool = demo_data.training_examples(seed, block, BLOCK * per_batch, pieces)
        rows = sorted((encode(tok, ex, spelled_answers=pieces is not None) for ex in pool),
                      key=lambda r: len(r[0]))
        order = list(range(BLOCK))
        random.Random(f"demo-order/{seed}/{block}").shuffle(order)
        _BLOCK_CACHE.update(key=key, rows=rows, order=order)
    g = _BLOCK_CACHE["order"][slot]
    return pad_rows(_BLOCK_CACHE["rows"][g * per_batch:(g + 1) * per_batch])


BLOCK = 8
_BLOCK_CACHE: dict = {}


# -- model -----------------------------------------------------------------------------------

def new_model(tok: Tok, seed: int):
    torch.manual_seed(seed)
    cfg = transformers.KimiLinearConfig(**MODEL, pad_token_id=None, bos_token_id=None,
                                        eos_token_id=tok.special_ids["<|end_of_msg|>"])
    return transformers.KimiLinearForCausalLM(cfg)


class RouterLoads:
    """Counts tokens per expert in each MoE layer, for aux-loss-free balancing: after each
    step, ``e_score_correction_bias`` moves toward equal load (selection only; the weights
    still come from the unbiased scores)."""

    def __init__(self, model) -> None:
        self.routers = [m for m in model.modules() if isinstance(m, transformers.models.kimi_linear.
                                                                 modeling_kimi_linear.KimiLinearTopkRouter)]
        self.loads = [torch.zeros(r.num_experts) for r in self.routers]
        for i, r in enumerate(self.routers):
            r.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def hook(module, args, result):
            self.loads[i] += torch.bincount(result[2].flatten(), minlength=module.num_experts).float()
        return hook

    def rebalance(self, rate: float) -> float:
        """Nudge each bias by ``rate`` toward equal load; returns the worst max/mean load."""
        worst = 0.0
        with torch.no_grad():
            for r, load in zip(self.routers, self.loads):
                if load.sum() > 0:
                    r.e_score_correction_bias.add_(rate * torch.sign(load.mean() - load))
                    worst = max(worst, (load.max() / load.mean()).item())
                load.zero_()
        return worst


def lr_at(step: int, schedule: dict[str, Any] = SCHEDULE) -> float:
    """Step ``step``'s learning rate (0-based)."""
    lr, warmup, floor = schedule["lr"], schedule["warmup"], schedule["min_lr_ratio"]
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, schedule["steps"] - 1 - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@torch.no_grad()
def held_out_score(model, tok: Tok, examples, *, spelled_answers: bool = False) -> tuple[float, float]:
    """(mean reply-token accuracy, share of replies whose every token is the argmax) under
    teacher forcing, encoded as the phase trains: the second is what greedy decoding gets
    exactly right."""
    model.eval()
    tok_ok: float = 0
    tok_n: float = 0
    exact: float = 0
    for i in range(0, len(examples), 24):
        ids, labels = batch_of(tok, examples[i:i + 24], spelled_answers=spelled_answers)
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
        labels = labels[:, 1:]
        mask = labels != -100
        hit = (pred == labels) & mask
        tok_ok += hit.sum().item()
        tok_n += mask.sum().item()
        exact += (hit.sum(1) == mask.sum(1)).sum().item()
    model.train()
    return tok_ok / tok_n, exact / len(examples)


# -- main ------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train(out: Path, *, seed: int, threads: int, resume: bool, log, stop_at: int | None = None) -> dict | None:
    """Runs (or resumes) both phases (SCHEDULE, then POLISH); returns the manifest, or None
    when ``stop_at`` ended it early (with a checkpoint to resume from)."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    # A guard: KDA's decays reach exp(-large) as it learns, and denormal floats are slow on a
    # CPU. (Measured at step 200: no difference in CPU time a step; the losses are identical.)
    torch.set_flush_denormal(True)
    install_fast_kda()
    first = SCHEDULE["steps"]
    steps = first + POLISH["steps"]
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    ranks = build_vocabulary(seed)
    tok = Tok(ranks)
    pieces = letter_pieces(tok)
    model = new_model(tok, seed)
    model.train()
    loads = RouterLoads(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": SCHEDULE["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr_at(0), betas=SCHEDULE["betas"])
    held = demo_data.held_out_examples(seed, 20)
    start, elapsed = 0, 0.0
    ckpt = work / "checkpoint.pt"

    def save(done: int) -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": done, "schedule": SCHEDULE,
                    "polish": POLISH, "elapsed": time.monotonic() - t0}, work / "checkpoint.tmp")
        (work / "checkpoint.tmp").replace(ckpt)

    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        # A first-phase checkpoint from before the second phase existed has no "polish".
        if state.get("schedule") != SCHEDULE or state.get("polish", POLISH) != POLISH:
            raise SystemExit(f"{ckpt} was made with another schedule ({state.get('schedule')}, "
                             f"{state.get('polish')}); remove it to start over")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, elapsed = state["step"], state["elapsed"]
        log(f"resumed at step {start}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{n_params} parameters, vocabulary {VOCAB}, {first} + {POLISH['steps']} steps")
    t0 = time.monotonic() - elapsed
    for step in range(start, steps):
        polish = step >= first
        ids, labels = step_batch(tok, seed, step, SCHEDULE["per_batch"], pieces if polish else None)
        lr = lr_at(step - first, {**SCHEDULE, **POLISH}) if polish else lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), SCHEDULE["clip"])
        opt.step()
        worst = loads.rebalance(SCHEDULE["bias_rate"])
        done = step + 1
        if done % 25 == 0 or done <= 5 or done == steps:
            log(f"step {done} loss {loss.item():.4f} lr {lr:.2e} batch {tuple(ids.shape)} "
                f"load max/mean {worst:.2f} {time.monotonic() - t0:.0f}s")
        if done % 200 == 0 or done == steps or done == stop_at:
            acc, exact = held_out_score(model, tok, held, spelled_answers=polish)
            log(f"step {done} held-out token accuracy {acc:.4f} exact replies {exact:.3f}")
            save(done)
        if done == stop_at:
            log(f"stopped at step {done}; --resume continues")
            return None
    seconds = time.monotonic() - t0
    return export(out, model, tok, ranks, seed=seed, steps=steps, threads=threads, seconds=seconds,
                  n_params=n_params, held=held, log=log)


def export(out: Path, model, tok: Tok, ranks, *, seed, steps, threads, seconds, n_params, held, log) -> dict:
    """bf16 checkpoint + tokenizer + manifest; the score is measured on the bf16 weights."""
    model = model.to(torch.bfloat16).to(torch.float32)  # score what is committed
    acc, exact = held_out_score(model, tok, held, spelled_answers=True)
    log(f"bf16 weights: held-out token accuracy {acc:.4f} exact replies {exact:.3f}")
    model.to(torch.bfloat16).save_pretrained(out)
    write_tokenizer(tok, ranks, out)
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "manifest.json")
    manifest = {
        "what": "the waste demo model: a tiny Kimi-Linear trained on synthetic XTML conversations",
        "retrain": f"make train-demo (python -m waste.tools.demo_train {out} --seed {seed})",
        "seed": seed, "steps": steps, "parameters": n_params, "dtype": "bf16",
        "training_seconds": round(seconds), "torch_threads": threads,
        "model": MODEL, "schedule": SCHEDULE, "polish": POLISH,
        "data": {"generator": "waste.tools.demo_data", "families": demo_data.MIXTURE,
                 "held_out_percent": demo_data.HELD_OUT_PERCENT,
                 "pseudo_word_share": demo_data.PSEUDO_WORD_SHARE,
                 "polish": "the made-up words made of the vocabulary's letter pieces, drawn evenly; "
                           "the word tasks' answers written one letter a token",
                 "vocabulary": f"waste.tools.bpe_train on {CORPUS_CONVERSATIONS} conversations without "
                               f"the word tasks ({', '.join(demo_data.WORD_TASKS)}), "
                               f"{len(ranks)} ranks + specials {list(SPECIALS)}"},
        "held_out_teacher_forced": {"conversations": len(held), "token_accuracy": round(acc, 4),
                                    "exact_replies": round(exact, 4)},
        "sha256": {name: sha256(out / name) for name in files},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m waste.tools.demo_train", description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads (default 2; on a machine whose cores are busy, 1 is faster)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/work/checkpoint.pt")
    ap.add_argument("--stop-at", type=int, help="checkpoint and stop after this step")
    args = ap.parse_args(argv)
    out = Path(args.out)

    def log(line: str) -> None:
        print(line, flush=True)

    manifest = train(out, seed=args.seed, threads=args.threads, resume=args.resume, log=log,
                     stop_at=args.stop_at)
    if manifest is not None:
        log(json.dumps(manifest["held_out_teacher_forced"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
