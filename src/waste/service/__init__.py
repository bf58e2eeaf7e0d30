"""The application's service: the generation worker between the HTTP adapter and the engine.

Driving adapters (HTTP) call it; it calls the ports (``waste.domain.ports``) only. The
composition root (``waste.app``) hands it an engine opener.
"""

from waste.service.generation import (EngineLoadFailed, EngineLoading, EngineOpener, Failed,
                                      Finished, GenerationService, Job, QueueFull, Released,
                                      ShuttingDown, Started)

__all__ = ["GenerationService", "EngineOpener", "Job", "Started", "Released", "Finished",
           "Failed", "QueueFull", "ShuttingDown", "EngineLoading", "EngineLoadFailed"]
