"""Kimi K3's XTML: the markers, the prompt renderer and the reply parser (docs/XTML.md).

``markers`` names every XTML special once; ``render`` turns messages into segments (with
``arguments`` and ``tool_results`` for tool calls and results); ``reply`` reads the model's
output back; ``format`` is the XTML ``ChatFormat``.
"""
