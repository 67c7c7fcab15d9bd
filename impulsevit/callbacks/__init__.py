"""Lightning callbacks: the initializer, attention-map diagnostics, throughput, the non-finite-loss guard, SLURM
preemption, the run's checkpoints (``last.ckpt``, per-rank RNG states), and :func:`standard_callbacks`, the one place
a run's set is assembled."""

from impulsevit.callbacks.attention_evolution import AttentionEvolution
from impulsevit.callbacks.attention_logging import AttentionMapLogger, log_attention
from impulsevit.callbacks.console import LineProgressBar
from impulsevit.callbacks.initializer import Initializer
from impulsevit.callbacks.nan_guard import NonFiniteLossGuard
from impulsevit.callbacks.rng_state import RNGStateCheckpoint
from impulsevit.callbacks.run_checkpoint import RunCheckpoint
from impulsevit.callbacks.standard import standard_callbacks
from impulsevit.callbacks.throughput import ThroughputLogger

__all__ = ["AttentionEvolution", "AttentionMapLogger", "Initializer", "LineProgressBar", "NonFiniteLossGuard",
           "RNGStateCheckpoint", "RunCheckpoint", "ThroughputLogger", "log_attention", "standard_callbacks"]
