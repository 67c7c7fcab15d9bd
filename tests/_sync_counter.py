"""``SyncCounter``: a ``TorchDispatchMode`` that counts the ops that would synchronise the host with a CUDA device
(scalar reads, data-shaped outputs, host tensors lifted per call, linalg error checks; the full list and why is in
tests/training/test_sync_free.py's docstring). Shared by that file and tests/data/loading/test_device_resample.py."""

from __future__ import annotations

import os
import sys
import traceback
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SCALAR_READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.allclose.default}
DATA_SHAPED = {aten.nonzero.default, aten.masked_select.default, aten.bincount.default, aten._unique2.default,
               aten.unique_dim.default, aten.unique_consecutive.default, aten.repeat_interleave.Tensor}
LIFTS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
LINALG_CHECKS = {aten._linalg_check_errors.default}


def _is_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in SCALAR_READS or func in DATA_SHAPED or func in LIFTS or func in LINALG_CHECKS:
        return True
    if func is aten.repeat_interleave.self_Tensor and kwargs.get("output_size") is None:
        return True
    if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):  # boolean-mask indexing
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
    return False


class SyncCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if not self.paused and _is_sync(func, args, kwargs):
            self.ops[str(func)] += 1
            if os.environ.get("SYNC_TRACE"):  # where each counted op comes from
                print(f"--- {func}\n" + "".join(traceback.format_stack(limit=12)[:-1]), file=sys.stderr)
        return func(*args, **kwargs)
