"""The HTTP adapter: Quart-Trio routes, SSE framing and the one error-mapping table."""
