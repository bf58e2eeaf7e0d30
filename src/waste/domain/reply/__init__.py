"""From generated tokens to an OpenAI reply: events, stop strings and the reply assembler.

``events`` holds what every reply reader produces (``Delta``, ``ToolCall``) and the one
``ReplyReader`` Protocol; ``text`` the raw-continuation reader; ``stop_strings`` the stop-string
filter; ``assembler`` the ``ReplyAssembler`` that runs inside the token callback.
"""
