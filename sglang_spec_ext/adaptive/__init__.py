"""Adaptive draft-width controller (engine agnostic; never imports SGLang).

``AdaptiveController(AdaptiveConfig(...))``: ``choose_k(batch_size)`` before drafting,
``on_verify(batch_size, k, accepted_per_req, step_time_s)`` after each verify,
``snapshot()`` for logs and metrics.
"""

from .config import AdaptiveConfig
from .controller import AdaptiveController

__all__ = ["AdaptiveConfig", "AdaptiveController"]
