"""The pure core of waste: request validation, chat formats, prompt rendering, reply reading.

Imports nothing but the standard library and attrs, so other services can embed it. The
names below are the public surface (README, "Using the domain without a server"); the
sub-packages hold the rest: ``requests``, ``xtml``, ``chatjson``, ``reply``, plus ``ports``
(what the domain needs from an engine), ``errors`` and ``segments``.
"""

from waste.domain.chat_format import Capabilities, ChatFormat, ChatPlan, NoChatFormat, NoFormat
from waste.domain.chatjson.format import ChatJsonFormat
from waste.domain.chatjson.load import load_chat_format
from waste.domain.errors import (ChatFormatError, ContextLengthExceeded, DomainError,
                                 InvalidRequest, KimiToolError, XTMLError)
from waste.domain.format_choice import select_chat_format
from waste.domain.reply.assembler import Output, ReplyAssembler
from waste.domain.reply.events import Delta, ReplyReader, ToolCall
from waste.domain.reply.text import TextReader
from waste.domain.requests import (ChatRequest, CompletionRequest, parse_chat_request,
                                   parse_completion_request, parse_json_body)
from waste.domain.segments import Segment
from waste.domain.xtml.format import XtmlFormat
from waste.domain.xtml.render import render_segments
from waste.domain.xtml.reply import RegionParser

__all__ = [
    # requests
    "parse_json_body", "parse_chat_request", "parse_completion_request", "ChatRequest",
    "CompletionRequest",
    # chat formats and prompts
    "ChatFormat", "ChatPlan", "Capabilities", "select_chat_format", "load_chat_format",
    "XtmlFormat", "ChatJsonFormat", "NoFormat", "render_segments", "Segment",
    # replies
    "ReplyReader", "RegionParser", "TextReader", "ReplyAssembler", "Output", "Delta", "ToolCall",
    # errors
    "DomainError", "InvalidRequest", "XTMLError", "ChatFormatError", "KimiToolError",
    "ContextLengthExceeded", "NoChatFormat",
]
