"""vLLM behind the Engine and Tokenizer ports, at the token level (README "Scaling out").

``VllmEngine`` drives a vLLM OpenAI server with token ids (``/v1/completions``), and uses its
``/tokenize``, ``/detokenize`` and ``/tokenizer_info``; ``open_vllm_engine`` owns it for a
server's lifetime.
"""

from waste.adapters.vllm.engine import (VllmEngine, VllmOptions, discover_model, open_vllm,
                                        open_vllm_engine)

__all__ = ["VllmEngine", "VllmOptions", "discover_model", "open_vllm", "open_vllm_engine"]
