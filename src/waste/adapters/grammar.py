"""The grammar adapter: JSON schemas compiled by llguidance into per-token masks.

Implements the ``GrammarCompiler`` port (``waste.domain.ports``) over the served vocabulary:
every id's raw bytes (specials marked with a leading 0xFF, as llguidance expects), read once
through the Tokenizer port on the first constrained request. ``json_schema`` checks the
schema first, keyword by keyword, so an unsupported feature is a 400 naming its path
(``response_format.json_schema.schema.properties.tags.uniqueItems``), never a silently
unconstrained answer.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Sequence

import llguidance

from waste.domain.errors import InvalidRequest
from waste.domain.ports import Tokenizer
from waste.domain.reply.constraint import TokenMatcher

# The JSON Schema keywords llguidance's compiler implements (its json_schema docs); any other
# keyword in a schema object is refused with its path.
SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf",
    "allOf", "$ref", "$defs", "definitions", "title", "description", "default", "examples",
    "$schema", "$id", "minProperties", "maxProperties", "patternProperties", "multipleOf",
})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")
_ANY_JSON_OBJECT = {"type": "object"}


class LlguidanceMatcher:
    """One reply's grammar state (the ``TokenMatcher`` port)."""

    def __init__(self, matcher: Any, eos_id: int, close_ids: tuple[int, ...], *,
                 own_end: bool = False) -> None:
        self._matcher = matcher
        self._eos = eos_id
        self._close = close_ids
        self._own_end = own_end  # the grammar names its end marker itself (a whole reply)

    def fill(self, words: memoryview) -> None:
        mask = self._matcher.compute_bitmask()
        size = 4 * len(words)
        allowed = int.from_bytes(mask[:size], "little")
        ends = 0
        if not self._own_end:
            ends = (allowed >> self._eos) & 1
            allowed &= ~(1 << self._eos)  # the grammar's EOS is not a token to sample
        merged = int.from_bytes(words.tobytes(), "little") & allowed
        words[:] = memoryview(merged.to_bytes(size, "little")).cast("I")
        if ends:  # the grammar may end here: the answer's close ids stand for its EOS
            for token in self._close:
                words[token // 32] |= 1 << (token % 32)
        if self._matcher.is_error():
            raise RuntimeError(f"grammar error: {self._matcher.get_error()}")

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(self._eos if token in self._close and not self._own_end
                                           else token):
            raise RuntimeError(f"grammar refused token {token}: {self._matcher.get_error()}")

    def finished(self) -> bool:
        return bool(self._matcher.is_stopped())


class LlguidanceCompiler:
    """The ``GrammarCompiler`` port on one served vocabulary (built lazily, thread-safe)."""

    def __init__(self, tokenizer: Tokenizer, vocab: int, n_base_vocab: int, eos_id: int, *,
                 plain_limit: int | None = None) -> None:
        """``plain_limit``: plain ids at or past it are never offered under a grammar (the
        fake engine's 1.1M code-point vocabulary; None: every id is)."""
        self._plain_limit = plain_limit
        self._tokenizer = tokenizer
        self._vocab = vocab
        self._n_base = n_base_vocab
        self._eos = eos_id
        self._lock = threading.Lock()
        self._lltokenizer: Any = None

    def _tokens(self) -> Any:
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_Vocabulary(self._tokenizer, self._vocab, self._n_base,
                                                            self._eos, self._plain_limit)),
                    n_vocab=self._vocab)
            return self._lltokenizer

    def json_schema(self, schema: dict[str, Any] | None, param: str) -> Callable[[tuple[int, ...]], TokenMatcher]:
        """A factory of matchers for ``schema`` (None: any JSON object). Blocking (the first
        call reads the vocabulary).

        Raises:
            InvalidRequest: a keyword the compiler does not implement or a pattern it cannot
                compile, with ``param`` extended by the schema path; or a schema llguidance
                refuses as a whole (``param`` itself).
        """
        target = _ANY_JSON_OBJECT if schema is None else schema
        _check(target, param)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(target), overrides={"whitespace_flexible": False})
        tokens = self._tokens()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokens)
        if error and not error.startswith("WARNING"):
            raise InvalidRequest(f"{param}: the schema cannot be enforced: {error}", param, "invalid_value")

        def new_matcher(close_ids: tuple[int, ...]) -> TokenMatcher:
            return LlguidanceMatcher(llguidance.LLMatcher(tokens, grammar, log_level=0), self._eos, close_ids)

        return new_matcher

    def lark(self, grammar: str, schemas: Sequence[tuple[Any, str]]) -> Callable[[], TokenMatcher]:
        """A factory of matchers for a whole-reply grammar (tool calls). Blocking.

        Raises:
            InvalidRequest: a schema keyword the compiler does not implement, named by its
                path (``tools[0].function.parameters.properties.x.uniqueItems``); or a grammar
                llguidance refuses as a whole (param ``tools``).
        """
        for schema, param in schemas:
            _check(schema, param)
        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        except ValueError as exc:
            raise InvalidRequest(f"tools: the tool calls cannot be enforced: {exc}", "tools",
                                 "invalid_value") from None
        tokens = self._tokens()
        error = llguidance.LLMatcher.validate_grammar(compiled, tokens)
        if error and not error.startswith("WARNING"):
            raise InvalidRequest(f"tools: the tool calls cannot be enforced: {error}", "tools",
                                 "invalid_value")

        def new_matcher() -> TokenMatcher:
            return LlguidanceMatcher(llguidance.LLMatcher(tokens, compiled, log_level=0), self._eos, (),
                                     own_end=True)

        return new_matcher


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: every id's bytes, specials marked."""

    def __init__(self, tokenizer: Tokenizer, vocab: int, n_base: int, eos_id: int,
                 plain_limit: int | None = None) -> None:
        self._tokenizer = tokenizer
        self._plain_limit = n_base if plain_limit is None else min(plain_limit, n_base)
        self.eos_token_id = eos_id
        self.bos_token_id = None
        self.special_token_ids = list(range(n_base, vocab))
        self.tokens = [self._bytes(token, n_base) for token in range(vocab)]
        self._ids: dict[bytes, int] = {}
        for token, raw in enumerate(self.tokens[:n_base]):
            if raw:
                self._ids.setdefault(raw, token)
        self._longest = max((len(raw) for raw in self._ids), default=1)

    def _bytes(self, token: int, n_base: int) -> bytes:
        if self._plain_limit <= token < n_base:
            return b""  # not offered under a grammar (see LlguidanceCompiler)
        try:
            raw = self._tokenizer.detokenize([token])
        except Exception:  # an id with no text (padding rows): never allowed by a grammar
            return b""
        return b"\xff" + raw if token >= n_base else raw

    def __call__(self, text: bytes | str) -> Sequence[int]:
        """Greedy longest-match over the plain tokens' bytes. llguidance calls this while the
        engine generates (from the mask callback), where no engine call is allowed; any
        segmentation serves its purpose (forced bytes), so no BPE is needed."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        out, at = [], 0
        while at < len(data):
            for size in range(min(self._longest, len(data) - at), 0, -1):
                token = self._ids.get(data[at:at + size])
                if token is not None:
                    out.append(token)
                    at += size
                    break
            else:
                raise ValueError(f"byte {data[at]:#x} has no token")
        return out


def _check(schema: Any, path: str) -> None:
    """Refuse, by path, what llguidance would not enforce."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{path} must be a JSON schema object.", path, "invalid_value")
    for key, value in schema.items():
        here = f"{path}.{key}"
        if key not in SUPPORTED_KEYWORDS:
            raise InvalidRequest(f"{here}: the JSON schema keyword {key!r} is not supported by the "
                                 "constrained decoder.", here, "unsupported_value")
        if key in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                raise InvalidRequest(f"{here} must be an object.", here, "invalid_value")
            for name, sub in value.items():
                _check(sub, f"{here}.{name}")
        elif key in _SUBSCHEMA_LISTS:
            if not isinstance(value, list):
                raise InvalidRequest(f"{here} must be a list.", here, "invalid_value")
            for i, sub in enumerate(value):
                _check(sub, f"{here}[{i}]")
        elif key in _SUBSCHEMA_ONE and not isinstance(value, bool):
            _check(value, here)
        elif key == "pattern":
            grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "string", "pattern": value})
            error = llguidance.LLMatcher.validate_grammar(grammar)
            if error and not error.startswith("WARNING"):
                raise InvalidRequest(f"{here}: the pattern cannot be enforced: {error.splitlines()[-1]}",
                                     here, "unsupported_value")
