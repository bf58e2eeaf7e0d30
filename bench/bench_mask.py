"""The grammar's cost per token: mask time as a share of decode time (issue 14).

Generates a constrained reply and times every mask callback; decode time is the engine's own
decode_ms. ``--grammar json`` (default): a JSON-schema answer (llguidance through the server's
own adapter and AnswerConstraint); ``--grammar tools``: a forced tool call, the whole reply under
the tool grammar (ReplyConstraint), thinking on. Runs on a container you name, on the default
demo model (``--demo``: data/demo-model converted as the tests do), or on a synthetic one it
builds; with ``--floor`` the budget is the memory floor, so every routed expert streams from disk.

    .venv/bin/python bench/bench_mask.py [CONTAINER | --demo] [--floor] [--grammar json|tools] [--tokens 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from waste.adapters.grammar import LlguidanceCompiler
from waste.adapters.native.context import plan_memory
from waste.adapters.native.engine import NativeEngine
from waste.adapters.native.options import NativeOptions
from waste.domain.format_choice import select_chat_format
from waste.domain.ports import SamplingParams
from waste.domain.reply.assembler import ReplyAssembler
from waste.domain.reply.constraint import AnswerConstraint, ReplyConstraint
from waste.domain.requests import parse_chat_request

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
    "score": {"type": "number", "minimum": 0, "maximum": 100},
    "kind": {"enum": ["alpha", "beta", "gamma"]}},
    "required": ["name", "tags", "score", "kind"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "maxLength": 40}}, "required": ["tz"]}}},
    {"type": "function", "function": {"name": "describe", "parameters": SCHEMA}}]


def run(container: Path, floor: bool, tokens: int, grammar: str = "json") -> dict:
    options = NativeOptions(ctx_tokens=4096, usage_path="")
    if floor:
        options = NativeOptions(ctx_tokens=4096, usage_path="",
                                ram_budget_bytes=plan_memory(container, options).floor_bytes)
    engine = NativeEngine(container, options)
    try:
        info = engine.model_info()
        fmt = select_chat_format(engine, engine.chat_template(), image_placeholder_id=info.media_placeholder_id,
                                 vision=False)
        if grammar == "tools":
            req = parse_chat_request({"messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
                                      "tools": TOOLS, "tool_choice": "required"})
        else:
            req = parse_chat_request({"messages": [{"role": "user", "content": "Describe a cat as JSON."}],
                                      "thinking": False, "response_format": {
                                          "type": "json_schema", "json_schema": {"schema": SCHEMA}}})
        plan = fmt.plan(req, default_thinking=grammar == "tools")
        ids: list[int] = []
        for seg in plan.segments:
            ids += engine.tokenize_markup(seg.text) if seg.markup else engine.tokenize(seg.text)
        started = time.perf_counter()
        compiler = LlguidanceCompiler(engine, info.vocab, info.n_base_vocab, fmt.end_ids[0])
        assembler = ReplyAssembler.create(plan.new_reader(), ())
        constraint: AnswerConstraint | ReplyConstraint
        if grammar == "tools":
            assert plan.reply_grammar is not None
            new_matcher = compiler.lark(plan.reply_grammar.lark, plan.reply_grammar.schemas)
            constraint = ReplyConstraint(matcher=new_matcher())
        else:
            factory = compiler.json_schema(SCHEMA, "schema")
            end = tuple(engine.tokenize_markup(plan.answer_end)) if plan.answer_end else plan.stop_ids[:1]
            constraint = AnswerConstraint(reader=assembler.reader, matcher=factory(end[:1]), end_sequence=end)
        setup_s = time.perf_counter() - started
        mask_s = [0.0]

        def timed_mask(index: int, words: memoryview) -> bool:
            t0 = time.perf_counter()
            try:
                return constraint(index, words)
            finally:
                mask_s[0] += time.perf_counter() - t0

        def on_token(event) -> bool:
            assembler.on_token(event)
            t0 = time.perf_counter()
            constraint.observe(event.token)
            mask_s[0] += time.perf_counter() - t0
            return assembler.should_stop

        engine.reset()
        result = engine.generate_ids(ids, SamplingParams(temperature=1.0, seed=1, max_tokens=tokens,
                                                         stop_ids=plan.stop_ids), on_token, mask=timed_mask)
        n = result.tokens_generated
        return {"container": str(container), "grammar": grammar, "floor_budget": floor, "vocab": info.vocab,
                "tokens": n,
                "grammar_setup_s": round(setup_s, 3), "decode_ms": round(result.decode_ms, 1),
                "mask_ms": round(mask_s[0] * 1000, 1),
                "mask_share_of_decode": round(mask_s[0] * 1000 / result.decode_ms, 4) if result.decode_ms else None,
                "mask_ms_per_token": round(mask_s[0] * 1000 / max(n, 1), 3), "stop": result.stop_reason,
                "answer": assembler.text[:80],
                "calls": [(c.name, c.arguments) for c in getattr(assembler.reader, "tool_calls", [])]}
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("container", nargs="?", type=Path)
    parser.add_argument("--floor", action="store_true", help="budget at the memory floor (experts stream)")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--grammar", choices=("json", "tools"), default="json")
    parser.add_argument("--demo", action="store_true", help="the default demo model (data/demo-model)")
    args = parser.parse_args()
    if args.demo:
        from waste.tools.convert import convert

        with tempfile.TemporaryDirectory() as tmp:
            demo = Path(__file__).resolve().parents[1] / "data" / "demo-model"
            print(run(convert(demo, Path(tmp) / "demo.waste"), args.floor, args.tokens, args.grammar))
    elif args.container is None:
        from waste.tools.make_container import build_container

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "synthetic.waste"
            build_container(path, seed=0)
            print(run(path, args.floor, args.tokens, args.grammar))
    else:
        print(run(args.container, args.floor, args.tokens, args.grammar))


if __name__ == "__main__":
    main()
