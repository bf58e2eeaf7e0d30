"""The thinking request: effort fields and switches (docs/HTTP.md §2.4, docs/XTML.md §5 "Thinking").

Three effort fields and three boolean switches can each ask for thinking. They must agree;
`medium` is refused, never replaced by `high`, because K3's encoder asserts it away.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from waste.domain.errors import InvalidRequest
from waste.domain.requests.fields import INVALID_VALUE, UNSUPPORTED, optional_object, shorten, wrong_type

ON_EFFORTS = ("low", "high", "max")
OFF_EFFORTS = ("none", "minimal", "off")

#: The XTML effort a thinking prompt gets when the request names none (release default).
DEFAULT_XTML_EFFORT = "max"


@attrs.frozen(kw_only=True)
class ThinkingChoice:
    """What a request asked about thinking, before server defaults.

    Attributes:
        switch: the boolean switches' value, None when no switch was given.
        effort: `low`, `high` or `max` when an effort field asked for one, else None.
        off: an effort field said `none`, `minimal` or `off`.
        param: the field that decided: the first effort field given, else the first switch;
            None when the request said nothing (then the server default applies).
    """

    switch: bool | None = None
    effort: str | None = None
    off: bool = False
    param: str | None = None

    @property
    def explicit(self) -> bool:
        """True when the request itself turned thinking on or off."""
        return self.param is not None


def _effort_fields(body: dict[str, Any]) -> Iterator[tuple[str, object]]:
    """Yield (param, value) for the effort fields in table order, checking the `reasoning` object."""
    yield "reasoning_effort", body.get("reasoning_effort")
    reasoning = optional_object(body, "reasoning")
    yield "reasoning.effort", None if reasoning is None else reasoning.get("effort")
    yield "thinking_effort", body.get("thinking_effort")


def _switch_fields(body: dict[str, Any]) -> Iterator[tuple[str, object]]:
    """Yield (param, value) for the switches in table order, checking `chat_template_kwargs`."""
    yield "thinking", body.get("thinking")
    kwargs = optional_object(body, "chat_template_kwargs")
    yield "chat_template_kwargs.thinking", None if kwargs is None else kwargs.get("thinking")
    yield "chat_template_kwargs.enable_thinking", None if kwargs is None else kwargs.get("enable_thinking")


def _check_effort(param: str, value: object) -> bool:
    """Validate one effort value; return True for an on-effort, False for an off-effort."""
    if type(value) is not str:
        raise wrong_type(param, "a string", value)
    if value in ON_EFFORTS:
        return True
    if value in OFF_EFFORTS:
        return False
    if value == "medium":
        raise InvalidRequest(
            f"{param} 'medium' is not supported: K3's encoder accepts only low, high and max "
            "(its own effort message lists medium, but the encoder rejects it). "
            "Send low, high or max, or none to turn thinking off.",
            param,
            UNSUPPORTED,
        )
    raise InvalidRequest(
        f"{param} must be one of low, high, max, none, minimal or off (exact lowercase),"
        f" not {shorten(value)}.",
        param,
        INVALID_VALUE,
    )


def parse_thinking(body: dict[str, Any]) -> ThinkingChoice:
    """Read the effort fields, then the switches, in the order of docs/HTTP.md §2.2.

    Args:
        body: the decoded request object.

    Returns:
        The request's thinking choice; resolve it with `resolve_thinking`.

    Raises:
        InvalidRequest: a mistyped field or container (`invalid_type`); an unknown effort
            (`invalid_value`); `medium` (`unsupported_value`); a field contradicting an earlier
            one of its kind (`invalid_value`, param = the later field); a switch contradicting the
            effort (`invalid_value`, param = the effort field).
    """
    effort_param, effort_on, effort = _agreed_effort(body)
    switch_param, switch = _agreed_switch(body)
    if effort_param is not None and switch is not None and switch != effort_on:
        asked = effort if effort_on else "an off effort"
        raise InvalidRequest(
            f"{effort_param} asks for {asked}, but {switch_param} is {str(switch).lower()}; "
            "the effort and the thinking switch contradict each other.",
            effort_param,
            INVALID_VALUE,
        )
    return ThinkingChoice(
        switch=switch,
        effort=effort,
        off=effort_param is not None and not effort_on,
        param=effort_param or switch_param,
    )


def _agreed_effort(body: dict[str, Any]) -> tuple[str | None, bool, str | None]:
    """The first effort field given, checked against every later one: (param, on, on-effort)."""
    effort_param: str | None = None
    effort: str | None = None
    effort_on = False
    for param, value in _effort_fields(body):
        if value is None:
            continue
        on = _check_effort(param, value)
        if effort_param is None:
            effort_param, effort_on, effort = param, on, (str(value) if on else None)
        elif on != effort_on or (on and value != effort):
            earlier = effort if effort_on else "off"
            raise InvalidRequest(
                f"{param}={shorten(value)} contradicts {effort_param} ({earlier}); send one effort.",
                param,
                INVALID_VALUE,
            )
    return effort_param, effort_on, effort


def _agreed_switch(body: dict[str, Any]) -> tuple[str | None, bool | None]:
    """The first thinking switch given, checked against every later one: (param, value)."""
    switch_param: str | None = None
    switch: bool | None = None
    for param, value in _switch_fields(body):
        if value is None:
            continue
        if type(value) is not bool:
            raise wrong_type(param, "a boolean", value)
        if switch_param is None:
            switch_param, switch = param, value
        elif value != switch:
            raise InvalidRequest(
                f"{param}={str(value).lower()} contradicts {switch_param}={str(switch).lower()}.",
                param,
                INVALID_VALUE,
            )
    return switch_param, switch


def resolve_thinking(choice: ThinkingChoice, *, default_on: bool) -> tuple[bool, str | None]:
    """Apply the server default (docs/XTML.md §5 table).

    Args:
        choice: what the request asked (`parse_thinking`).
        default_on: the server default: True unless `--no-thinking`.

    Returns:
        (thinking, xtml_effort): the effort is `low`/`high`/`max` when thinking is on (`max` when
        the request named none) and None when it is off. A chat.json renderer that must render
        no effort for a bare switch can tell from `choice.effort` being None.
    """
    if choice.effort is not None:
        return True, choice.effort
    if choice.off:
        return False, None
    thinking = default_on if choice.switch is None else choice.switch
    return thinking, (DEFAULT_XTML_EFFORT if thinking else None)
