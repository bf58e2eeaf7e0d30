"""waste: an OpenAI-compatible server and C engine for giant mixture-of-experts models."""

__version__ = "0.1.0"
