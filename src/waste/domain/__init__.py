"""The pure core of waste: prompt rendering, reply parsing, chat formats, request validation.

Imports nothing but the standard library and attrs, so other services can embed it.
"""
