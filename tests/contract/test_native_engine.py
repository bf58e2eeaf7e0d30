"""The Engine port contract against ``NativeEngine`` (libwaste through cffi), and its binding.

Runs on the synthetic container from ``conftest.py``. Expected values come from the
container's own files (specials.json, chat.json) or from a second run, never from a
hard-coded engine output.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import attrs
import pytest

from waste.app.settings import Settings
from waste.domain.ports import (Cancelled, ContextFull, EngineBusy, EngineError, EngineFormatError,
                                EngineIOError, InvalidArgument, InvalidState, Prompt,
                                SamplingParams, Unsupported)
from waste.tools.make_container import build_container

pytestmark = pytest.mark.native

XTML_MARKERS = ("<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", "<|media_begin|>",
                "<|media_content|>", "<|media_pad|>", "<|media_end|>",
                "<|kimi_image_placeholder|>", "[EOS]")
KIMI_LINEAR_MARKERS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                       "<|im_end|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
TEXT = "Hello, world! The café’s 3 dogs ran 1234 metres — 你好，世界 🙂\n\tdone."
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
ROOT = Path(__file__).resolve().parents[2]
NATIVE_CTX_TOKENS = 256  # conftest.py opens native_engine with this context


def container_specials(container: Path) -> dict[str, int]:
    return {entry["text"]: entry["id"]
            for entry in json.loads((container / "specials.json").read_text("utf-8"))}


def prompt_ids(engine) -> list[int]:
    return engine.tokenize_markup("<|open|>message role=\"user\"<|sep|>" + TEXT + "<|close|>")


def run(engine, prompt, params=GREEDY, stop_at=None):
    """Generate from position 0, collecting events; ``stop_at`` = index whose callback stops."""
    events = []

    def on_token(event):
        events.append(event)
        return stop_at is not None and event.index >= stop_at

    engine.reset()
    result = engine.generate_ids(prompt, params, on_token)
    return result, events


# -- identity -------------------------------------------------------------------------------
def test_model_info_describes_the_synthetic_container(native_engine, native_container):
    info = native_engine.model_info()
    manifest = json.loads((native_container / "manifest.json").read_text("utf-8"))
    config = manifest["config"]
    specials = container_specials(native_container)
    assert info.arch == manifest["arch"] == "kimi_linear"
    assert info.n_layers == config["num_hidden_layers"]
    assert info.hidden == config["hidden_size"]
    assert info.vocab == config["vocab_size"]
    assert (info.n_experts, info.top_k, info.n_shared_experts) == (
        config["num_experts"], config["num_experts_per_token"], config["num_shared_experts"])
    assert info.n_base_vocab == manifest["tokenizer"]["n_base_vocab"] > 256
    assert info.vocab > max(specials.values())
    assert info.ctx_tokens == NATIVE_CTX_TOKENS
    assert info.eos_id == specials["[EOS]"] == config["eos_token_id"]
    assert info.media_placeholder_id in (None, *specials.values())
    assert 0 < info.params_active < info.params_total
    assert info.quant and info.engine_version and info.build_info
    assert info.vision is False


def test_special_id_matches_the_container_specials(native_engine, native_container):
    specials = container_specials(native_container)
    assert set(XTML_MARKERS) <= set(specials)
    for text, token in specials.items():
        assert native_engine.special_id(text) == token
        assert native_engine.token_text(token) == text
    assert native_engine.special_id("hello") is None
    assert native_engine.special_id("<|open|><|sep|>") is None


# -- tokenizer ------------------------------------------------------------------------------
def test_plain_tokenize_never_yields_a_special(native_engine):
    text = "a" + "b".join(XTML_MARKERS) + "c"
    ids = native_engine.tokenize(text)
    assert ids and max(ids) < native_engine.n_base_vocab
    assert native_engine.detokenize(ids) == text.encode("utf-8")


@pytest.mark.parametrize("marker", XTML_MARKERS)
def test_markup_finds_each_marker(native_engine, marker):
    special = native_engine.special_id(marker)
    assert special is not None and special >= native_engine.n_base_vocab
    ids = native_engine.tokenize_markup('x"' + marker + "y")
    assert ids.count(special) == 1
    assert [i for i in ids if i >= native_engine.n_base_vocab] == [special]
    assert native_engine.detokenize(ids) == ('x"' + marker + "y").encode("utf-8")


def test_detokenize_round_trips(native_engine):
    for text in (TEXT, "", " ", "\r\n\r\n", "x" * 3000, "日本語のテキスト", "camelCaseWords don't"):
        assert native_engine.detokenize(native_engine.tokenize(text)) == text.encode("utf-8")


def test_detokenize_grows_its_buffer_when_asked(native_engine):
    # Many specials as markup: their text is long, so detokenize outgrows 8 bytes per id.
    text = "<|kimi_image_placeholder|>" * 200
    ids = native_engine.tokenize_markup(text)
    assert len(ids) == 200
    assert native_engine.detokenize(ids) == text.encode("utf-8")


def test_bad_ids_are_refused(native_engine):
    with pytest.raises(EngineError) as info:
        native_engine.detokenize([native_engine.model_info().vocab + 5])
    assert isinstance(info.value, InvalidArgument)
    with pytest.raises(EngineError) as info:
        native_engine.detokenize([2**40])
    assert isinstance(info.value, InvalidArgument) and "ids[0]" in info.value.detail


def test_tokenizer_context_matches_the_engine(native, native_engine, native_container):
    with native.NativeTokenizer.open(native_container) as tokenizer:
        assert tokenizer.tokenize(TEXT) == native_engine.tokenize(TEXT)
        assert tokenizer.tokenize_markup("<|open|>x") == native_engine.tokenize_markup("<|open|>x")
        assert tokenizer.n_base_vocab == native_engine.n_base_vocab


# -- generation -----------------------------------------------------------------------------
def test_greedy_generation_is_reproducible_after_reset(native_engine):
    prompt = prompt_ids(native_engine)
    first, events_a = run(native_engine, prompt)
    second, events_b = run(native_engine, prompt)
    assert [e.token for e in events_a] == [e.token for e in events_b]
    assert [e.piece for e in events_a] == [e.piece for e in events_b]
    assert first.tokens_generated == len(events_a) == GREEDY.max_tokens
    assert first.stop_reason == "max_tokens"
    assert first.prompt_tokens == len(prompt)
    assert [e.index for e in events_a] == list(range(len(events_a)))


def test_seeded_sampling_is_reproducible(native_engine):
    prompt = prompt_ids(native_engine)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=40, seed=7, max_tokens=16)
    _, a = run(native_engine, prompt, params)
    _, b = run(native_engine, prompt, params)
    assert [e.token for e in a] == [e.token for e in b]


@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 2.0 ** -150])
def test_a_top_p_below_float32s_range_keeps_the_top_token(native_engine, top_p):
    """A top_p the server accepts (0 < p <= 1) but float32 rounds to 0 is the nucleus of the
    top token alone, as any p below the top token's mass is; libwaste refused 0.0f with
    E_ARG (a 500 found by schemathesis)."""
    prompt = prompt_ids(native_engine)
    _, greedy = run(native_engine, prompt, SamplingParams(temperature=0.0, max_tokens=8))
    _, tiny = run(native_engine, prompt, SamplingParams(temperature=1.0, top_p=top_p, seed=5, max_tokens=8))
    assert [e.token for e in tiny] == [e.token for e in greedy]


@pytest.mark.parametrize("penalty", [5e-324, 1e-46])
def test_a_repetition_penalty_below_float32s_range_runs_as_the_smallest_float32(native_engine, penalty):
    """A repetition_penalty the server accepts (0 < r <= 10) but float32 rounds to 0 runs as
    the smallest positive float32; libwaste refused 0.0f with E_ARG (a 500 found by
    schemathesis)."""
    prompt = prompt_ids(native_engine)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=8)
    _, smallest = run(native_engine, prompt, attrs.evolve(params, repetition_penalty=2.0 ** -149))
    _, tiny = run(native_engine, prompt, attrs.evolve(params, repetition_penalty=penalty))
    assert tiny and [e.token for e in tiny] == [e.token for e in smallest]
    # l / r overflows float32 for every positive logit: it saturates, so logprobs stay finite.
    assert all(math.isfinite(e.logprob) for e in tiny + smallest)


def test_pieces_concatenate_to_detokenize(native_engine):
    _, events = run(native_engine, prompt_ids(native_engine),
                    SamplingParams(temperature=1.0, seed=3, max_tokens=48))
    ids = [e.token for e in events]
    assert b"".join(e.piece for e in events) == native_engine.detokenize(ids)
    assert all(e.logprob <= 0.0 for e in events)


def test_stop_id_ends_generation_on_that_token(native_engine):
    prompt = prompt_ids(native_engine)
    _, events = run(native_engine, prompt)
    stop = events[3].token
    first_hit = next(e.index for e in events if e.token == stop)
    result, stopped = run(native_engine, prompt,
                          SamplingParams(temperature=0.0, max_tokens=24, stop_ids=(stop,)))
    assert result.stop_reason == "token"
    assert len(stopped) == first_hit + 1 and stopped[-1].is_stop
    assert not any(e.is_stop for e in stopped[:-1])


@pytest.mark.parametrize("stop_at", [0, 2])
def test_callback_returning_true_stops_within_one_token(native_engine, stop_at):
    result, events = run(native_engine, prompt_ids(native_engine), stop_at=stop_at)
    assert result.stop_reason == "callback"
    assert result.tokens_generated == len(events) == stop_at + 1


def test_callback_exception_is_reraised_and_the_engine_still_works(native_engine):
    prompt = prompt_ids(native_engine)
    _, before = run(native_engine, prompt)
    seen = []

    class Boom(Exception):
        pass

    def on_token(event):
        seen.append(event.index)
        if event.index == 1:
            raise Boom("from the callback")
        return False

    native_engine.reset()
    with pytest.raises(Boom, match="from the callback"):
        native_engine.generate_ids(prompt, GREEDY, on_token)
    assert seen == [0, 1]
    _, after = run(native_engine, prompt)
    assert [e.token for e in after] == [e.token for e in before]


def test_oversize_prompt_is_e_ctx_and_evaluates_nothing(native_engine):
    native_engine.reset()
    with pytest.raises(EngineError) as info:
        native_engine.generate_ids([1] * (NATIVE_CTX_TOKENS + 1), GREEDY, lambda e: False)
    assert isinstance(info.value, ContextFull) and info.value.code == "E_CTX"
    assert native_engine.position() == 0
    result, _ = run(native_engine, prompt_ids(native_engine))
    assert result.tokens_generated == GREEDY.max_tokens


def test_a_full_context_stops_with_ctx_full(native_engine):
    prompt = [native_engine.tokenize("a")[0]] * (NATIVE_CTX_TOKENS - 4)
    result, events = run(native_engine, prompt, SamplingParams(temperature=0.0, max_tokens=0))
    assert result.stop_reason == "ctx_full"
    # Every delivered token but the last is evaluated (docs/ENGINE.md §2 Generation).
    assert len(events) == NATIVE_CTX_TOKENS - len(prompt) + 1
    assert native_engine.position() == NATIVE_CTX_TOKENS


def test_empty_prompt_is_e_arg(native_engine):
    with pytest.raises(EngineError) as info:
        native_engine.generate_ids([], GREEDY, lambda e: False)
    assert isinstance(info.value, InvalidArgument)


def test_statistics_move_with_generation(native_engine):
    before = native_engine.statistics()
    result, events = run(native_engine, prompt_ids(native_engine))
    after = native_engine.statistics()
    assert after.tokens_generated - before.tokens_generated == len(events) == result.tokens_generated
    assert (after.experts_hit + after.experts_missed) > (before.experts_hit + before.experts_missed)
    assert result.experts_hit + result.experts_missed > 0
    assert after.bytes_read >= before.bytes_read + result.bytes_read > before.bytes_read
    assert after.budget_bytes > 0 and after.peak_bytes > 0


def test_abort_from_the_callback_is_e_cancelled(native_engine):
    def on_token(event):
        native_engine.abort()
        return False

    native_engine.reset()
    with pytest.raises(EngineError) as info:
        native_engine.generate_ids(prompt_ids(native_engine), GREEDY, on_token)
    assert isinstance(info.value, Cancelled)
    result, _ = run(native_engine, prompt_ids(native_engine))
    assert result.tokens_generated == GREEDY.max_tokens


def test_a_call_from_inside_the_callback_is_e_busy(native, native_engine, native_container):
    outcomes = []
    with native.NativeTokenizer.open(native_container) as tokenizer:
        def on_token(event):
            try:
                native_engine.tokenize("x")
            except EngineError as exc:
                outcomes.append(type(exc))
            outcomes.append(tokenizer.tokenize("x"))  # the second context is free
            return True

        native_engine.reset()
        native_engine.generate_ids(prompt_ids(native_engine), GREEDY, on_token)
    assert outcomes == [EngineBusy, native_engine.tokenize("x")]


def test_statistics_are_readable_from_another_thread_during_generate(native_engine):
    seen = []

    def on_token(event):
        worker = threading.Thread(target=lambda: seen.append(native_engine.statistics()))
        worker.start()
        worker.join()
        return event.index >= 1

    native_engine.reset()
    native_engine.generate_ids(prompt_ids(native_engine), GREEDY, on_token)
    assert [s.tokens_generated for s in seen] == [seen[0].tokens_generated, seen[0].tokens_generated + 1]


# -- the port's generate: a fresh state per prompt ----------------------------------------------
def test_port_generate_starts_every_prompt_from_a_fresh_state(native_engine):
    prompt = Prompt(ids=tuple(prompt_ids(native_engine)))
    tokens = []
    for _ in range(2):
        events: list = []
        result = native_engine.generate(prompt, GREEDY, events.append)
        tokens.append([e.token for e in events])
        assert result.prompt_tokens == len(prompt.ids) and result.cached_tokens == 0
    assert tokens[0] == tokens[1] and len(tokens[0]) == GREEDY.max_tokens


def test_port_generate_asks_is_cancelled_before_any_work(native_engine):
    with pytest.raises(Cancelled):
        native_engine.generate(Prompt(ids=tuple(prompt_ids(native_engine))), GREEDY,
                               lambda e: False, is_cancelled=lambda: True)
    assert native_engine.position() == 0


def test_port_generate_refuses_a_full_prompt_with_both_numbers(native_engine):
    with pytest.raises(ContextFull) as info:
        native_engine.generate(Prompt(ids=(1,) * NATIVE_CTX_TOKENS), GREEDY, lambda e: False)
    assert (info.value.prompt_tokens, info.value.ctx_tokens) == (NATIVE_CTX_TOKENS,
                                                                 NATIVE_CTX_TOKENS)


def test_port_generate_cuts_max_tokens_to_the_room_left(native_engine):
    prompt = Prompt(ids=(native_engine.tokenize("a")[0],) * (NATIVE_CTX_TOKENS - 3))
    result = native_engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=50),
                                    lambda e: False)
    assert result.tokens_generated == 3 and result.stop_reason == "max_tokens"


# -- images, chat.json, lifetime ------------------------------------------------------------
def test_images_are_unsupported_without_a_vision_tower(native_engine):
    with pytest.raises(EngineError) as info:
        native_engine.add_image(bytes(2 * 2 * 3), 2, 2)
    assert isinstance(info.value, Unsupported)
    with pytest.raises(EngineError) as info:
        native_engine.add_image(bytes(5), 2, 2)
    assert isinstance(info.value, InvalidArgument) and "2x2" in info.value.detail


def test_expand_images_without_placeholders_is_the_identity_or_unsupported(native_engine):
    ids = native_engine.tokenize("plain text")
    try:
        assert native_engine.expand_images(ids) == ids
    except EngineError as exc:
        assert isinstance(exc, Unsupported)


def test_chat_template_is_none_without_chat_json(native_engine):
    assert native_engine.chat_template() is None


def test_chat_template_reads_chat_json(native, kimi_linear_container):
    engine = native.NativeEngine.open(kimi_linear_container, native.NativeOptions(usage_path=""))
    try:
        expected = (ROOT / "examples" / "chat-kimi-linear.json").read_text("utf-8")
        assert json.loads(engine.chat_template()) == json.loads(expected)
        for marker in KIMI_LINEAR_MARKERS:
            assert engine.special_id(marker) is not None, marker
        assert engine.special_id("<|open|>") is None
    finally:
        engine.close()


def test_close_is_idempotent_and_later_calls_fail(native, native_container):
    engine = native.NativeEngine.open(native_container, native.NativeOptions(usage_path=""))
    engine.close()
    engine.close()
    with pytest.raises(EngineError) as info:
        engine.tokenize("x")
    assert isinstance(info.value, InvalidState)
    assert engine.statistics().tokens_generated == 0
    assert engine.model_info().arch == "kimi_linear"


def test_options_are_validated_by_name(native):
    with pytest.raises(ValueError, match="cache_policy"):
        native.NativeOptions(cache_policy="fifo")
    with pytest.raises(ValueError, match="ctx_tokens"):
        native.NativeOptions(ctx_tokens=-1)


def test_open_native_returns_engine_and_tokenizer(native, native_container):
    # With the lock held by the engine, the tokenizer context must still open.
    options = native.NativeOptions(usage_path="", exclusive_open=True)
    engine, tokenizer = native.open_native(native_container, options)
    try:
        assert tokenizer.tokenize(TEXT) == engine.tokenize(TEXT)
        with pytest.raises(EngineError) as info:
            native.NativeEngine.open(native_container, options)
        assert isinstance(info.value, EngineBusy)
    finally:
        tokenizer.close()
        engine.close()


def test_a_missing_container_is_e_io_naming_it(native, tmp_path):
    with pytest.raises(EngineError) as info:
        native.NativeEngine.open(tmp_path / "absent.waste")
    assert isinstance(info.value, (EngineIOError, EngineFormatError)) and "absent.waste" in info.value.detail


def test_same_seed_gives_a_byte_identical_container(tmp_path, native_container):
    again = build_container(tmp_path / "again.waste", seed=0)
    names = sorted(p.name for p in native_container.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (native_container / name).read_bytes(), name


def test_close_from_inside_the_callback_is_e_busy(native_engine):
    statuses = []

    def on_token(event):
        try:
            native_engine.close()
        except EngineError as exc:
            statuses.append(type(exc))
        return True

    native_engine.reset()
    native_engine.generate_ids(prompt_ids(native_engine), GREEDY, on_token)
    assert statuses == [EngineBusy] and not native_engine.closed


def test_memory_plan_adds_up(native, native_container):
    plan = native.plan_memory(native_container, native.NativeOptions(ctx_tokens=NATIVE_CTX_TOKENS))
    manifest = json.loads((native_container / "manifest.json").read_text("utf-8"))
    top_k = manifest["config"]["num_experts_per_token"]
    assert plan.record_bytes == max(bank["record_bytes"] for bank in manifest["banks"])
    assert plan.record_bytes % 4096 == 0
    assert plan.min_cache_bytes == 2 * top_k * plan.record_bytes
    assert plan.floor_bytes == (plan.trunk_bytes + plan.state_bytes + plan.scratch_bytes
                                + plan.vision_bytes + plan.min_cache_bytes)
    assert plan.budget_bytes >= plan.floor_bytes


def test_a_library_of_another_api_version_is_refused(native, tmp_path):
    native.check_api_version()  # this build matches its header and the checkout's
    header = tmp_path / "waste.h"
    header.write_text("#define WASTE_API_VERSION 999\n", encoding="utf-8")
    with pytest.raises(EngineError) as info:
        native.check_api_version(header)
    assert isinstance(info.value, Unsupported) and "999" in info.value.detail


def test_options_from_the_server_settings(native):
    settings = Settings(model="m.waste", budget=3 << 30, ctx=8192, threads=2, cpus="0-1",
                        cache="lru", direct_io=False, vision=True, verify=True,
                        exclusive_open=True, usage="", io_threads=3, lookahead=True)
    assert native.NativeOptions.from_settings(settings) == native.NativeOptions(
        ram_budget_bytes=3 << 30, ctx_tokens=8192, n_threads=2, cpu_list="0-1",
        cache_policy="lru", direct_io=False, vision=True, verify=True, exclusive_open=True,
        usage_path="", io_threads=3, lookahead=1, activations="q8",  # the server's default
        prefix_cache=None)  # the server's default: a share of the budget
    assert native.NativeOptions.from_settings(
        attrs.evolve(settings, activations="f32")).activations == "f32"
    assert native.NativeOptions.from_settings(
        attrs.evolve(settings, prefix_cache=1 << 20)).prefix_cache == 1 << 20
    assert native.NativeOptions.from_settings(settings).prefix_interval == native.NativeOptions().prefix_interval == 1024
    assert native.NativeOptions.from_settings(
        attrs.evolve(settings, prefix_interval=64)).prefix_interval == 64
    tokenizer = native.NativeOptions.from_settings(settings).for_tokenizer()
    assert tokenizer.tokenizer_only and not tokenizer.exclusive_open and tokenizer.usage_path == ""


def test_close_waits_for_a_running_generate_and_aborts_it(native, native_container):
    engine = native.NativeEngine.open(native_container, native.NativeOptions(usage_path=""))
    started, release, outcome = threading.Event(), threading.Event(), []

    def on_token(event):
        started.set()
        release.wait(30)
        return False

    def generate():
        try:
            engine.generate_ids(prompt_ids(engine), SamplingParams(temperature=0.0, max_tokens=0), on_token)
            outcome.append("returned")
        except EngineError as exc:
            outcome.append(type(exc))

    worker = threading.Thread(target=generate)
    worker.start()
    assert started.wait(30)
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(0.05)
    assert not engine.closed  # close is waiting for the call that holds the context
    release.set()
    worker.join(30)
    closer.join(30)
    assert outcome == [Cancelled] and engine.closed
