"""Untrusted OpenAI request bodies in, frozen validated requests out (docs/HTTP.md §2).

``parse`` holds the two routes' parsers; ``fields``, ``messages``, ``thinking`` and
``json_body`` the checks they share. Every failure is ``InvalidRequest`` naming the field.
"""

from waste.domain.requests.fields import image_kind, local_image_path
from waste.domain.requests.json_body import parse_json_body
from waste.domain.requests.messages import ImagePart
from waste.domain.requests.parse import (ChatRequest, CompletionRequest, parse_chat_request,
                                         parse_completion_request)
from waste.domain.requests.thinking import ThinkingChoice, resolve_thinking

__all__ = ["ChatRequest", "CompletionRequest", "ImagePart", "ThinkingChoice", "image_kind",
           "local_image_path", "parse_chat_request", "parse_completion_request",
           "parse_json_body", "resolve_thinking"]
