"""Lightning callbacks: the initializer, attention-map diagnostics, throughput, and the non-finite-loss guard."""

from impulsevit.callbacks.attention_logging import AttentionMapLogger, log_attention
from impulsevit.callbacks.initializer import Initializer
from impulsevit.callbacks.nan_guard import NonFiniteLossGuard
from impulsevit.callbacks.throughput import ThroughputLogger

__all__ = ["AttentionMapLogger", "Initializer", "NonFiniteLossGuard", "ThroughputLogger", "log_attention"]
