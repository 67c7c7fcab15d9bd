"""Weight selection (Xu et al., ICLR 2024): initialise a smaller student from a larger teacher of the same family.

Tensors are matched by identical state-dict names, so layer selection is "first N" (student ``blocks.j`` takes teacher
``blocks.j``; a deeper teacher's extra blocks are unused). Every axis of every matched floating-point tensor is
sub-sampled uniformly (``docs/method.md`` §5.2): ``arange(s)·(T/s)`` when ``T % s == 0``, else ``round(linspace(0, T−1,
s))``. The classifier (``head.*`` by default) keeps the student's own init; integer buffers (e.g. Swin's
``relative_position_index``) are never copied. Deterministic: draws no random numbers.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from impulsevit.init.api import InitResult, read_full, register
from impulsevit.init.baselines import write_values
from impulsevit.init.options import as_dict
from impulsevit.safe_load import load_checkpoint

__all__ = ["selection_indices", "select_tensor", "load_teacher_state", "weight_selection_values",
           "WeightSelectionOptions"]


@dataclasses.dataclass(frozen=True)
class WeightSelectionOptions:
    """Options of ``weight_selection``.

    Attributes:
        teacher: the larger model: an ``nn.Module``, a state dict or a checkpoint path (required).
        skip: parameter-name prefixes that keep the student's own init (a string is one prefix).
        strict: fail when a student tensor has no teacher tensor of the same name (else keep its init).
    """

    teacher: Any = None
    skip: str | list[str] | tuple[str, ...] = ("head.",)
    strict: bool = True


def selection_indices(teacher_size: int, student_size: int) -> torch.Tensor:
    """Uniform element selection along one axis: ``LongTensor (student_size,)`` of teacher indices.

    Raises:
        ValueError: ``teacher_size < student_size``.
    """
    if teacher_size < student_size:
        raise ValueError(f"teacher axis has {teacher_size} elements, fewer than the student's {student_size}")
    if teacher_size % student_size == 0:
        return torch.arange(student_size) * (teacher_size // student_size)
    return torch.round(torch.linspace(0, teacher_size - 1, student_size, dtype=torch.float64)).long()


def select_tensor(teacher: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sub-sample every axis of ``teacher`` to ``shape`` with :func:`selection_indices`."""
    if teacher.dim() != len(shape):
        raise ValueError(f"teacher tensor has {teacher.dim()} axes, student {len(shape)}")
    out = teacher
    for axis, s in enumerate(shape):
        out = out.index_select(axis, selection_indices(out.shape[axis], int(s)))
    return out


def load_teacher_state(teacher: nn.Module | Mapping[str, torch.Tensor] | str | os.PathLike) -> dict[str, torch.Tensor]:
    """The teacher's state dict (CPU, full tensors) from a model, a state dict, or a ``.pth``/``.pt``/``.safetensors``
    file (a ``{'model': ...}`` / ``{'state_dict': ...}`` wrapper is unwrapped).

    A ``.pth``/``.pt`` file is read through :mod:`impulsevit.safe_load` (``weights_only``; a file that would run code
    is refused unless ``--trust-checkpoint`` / ``IMPULSEVIT_TRUST_CHECKPOINT=1``).

    Raises:
        ValueError: unreadable file or not a mapping of tensors (:class:`~impulsevit.safe_load.UntrustedFileError`:
            a file that would run code).
    """
    if isinstance(teacher, nn.Module):
        state = teacher.state_dict()
    elif isinstance(teacher, Mapping):
        state = dict(teacher)
    elif isinstance(teacher, str | os.PathLike):
        path = os.fspath(teacher)
        if not os.path.isfile(path):
            raise ValueError(f"weight_selection teacher file {path!r} does not exist")
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = load_checkpoint(path, what="weight_selection teacher")
        for key in ("state_dict", "model", "state_dict_ema"):
            if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
                state = state[key]
                break
    else:
        raise ValueError(f"weight_selection teacher must be a module, a state dict or a path, got {type(teacher)}")
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError("weight_selection teacher is not a mapping of parameter names to tensors")
    return {k.removeprefix("module."): read_full(v).detach().cpu() for k, v in state.items()}


def _depth(keys: Sequence[str]) -> int:
    ids = {int(m.group(1)) for k in keys if (m := re.match(r"blocks\.(\d+)\.", k))}
    return max(ids) + 1 if ids else 0


def weight_selection_values(
    student: nn.Module, teacher_state: Mapping[str, torch.Tensor], skip: Sequence[str] = ("head.",), strict: bool = True
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """New values for the student's floating-point state (computed, not written) and notes.

    Args:
        skip: name prefixes kept at the student's own init.
        strict: a student tensor with no same-named teacher tensor is an error (else it keeps its init, noted).

    Raises:
        ValueError: naming the student class, the tensor and the axis where the teacher is smaller, has a different
            number of axes, or lacks the tensor (with ``strict``).
    """
    name = type(student).__name__
    values: dict[str, torch.Tensor] = {}
    missing, skipped = [], []
    targets = dict(student.named_parameters())
    targets.update({k: b for k, b in student.named_buffers() if b.is_floating_point()})
    for key, p in targets.items():
        if any(key.startswith(s) for s in skip):
            skipped.append(key)
            continue
        if key not in teacher_state:
            missing.append(key)
            continue
        t = teacher_state[key]
        if t.dim() != p.dim():
            raise ValueError(
                f"{name}.{key}: teacher tensor {tuple(t.shape)} and student {tuple(p.shape)} differ in axes"
            )
        for axis, (teacher_size, student_size) in enumerate(zip(t.shape, p.shape)):
            if teacher_size < student_size:
                raise ValueError(
                    f"{name}.{key}: teacher dim {teacher_size} < student dim {student_size} on axis {axis} "
                    f"(teacher {tuple(t.shape)}, student {tuple(p.shape)}); weight selection needs a teacher at least "
                    "as large everywhere"
                )
        values[key] = select_tensor(t.float(), p.shape)
    if missing and strict:
        raise ValueError(
            f"{name}: teacher has no tensor for {len(missing)} student entries, e.g. {missing[:4]} (student deeper "
            "than the teacher, or a different architecture); pass strict=False to keep their init"
        )
    notes = []
    student_depth, teacher_depth = _depth(list(targets)), _depth(list(teacher_state))
    if student_depth and teacher_depth and student_depth != teacher_depth:
        notes.append(f"layer selection: first {student_depth} of the teacher's {teacher_depth} blocks")
    if skipped:
        notes.append(f"kept the student's init for {len(skipped)} tensors: {', '.join(skipped)}")
    if missing:
        notes.append(f"no teacher tensor, kept init: {', '.join(missing)}")
    return values, notes


@register("weight_selection", family="any", matches=lambda m: isinstance(m, nn.Module),
          options=WeightSelectionOptions)
def _weight_selection_any(model: nn.Module, generator: torch.Generator, options: WeightSelectionOptions) -> InitResult:
    """Weight selection from ``teacher`` (module, state dict or checkpoint path); see the module docstring."""
    teacher = options.teacher
    if teacher is None:
        raise ValueError(f"init method 'weight_selection' on {type(model).__name__} needs the option teacher=...")
    skip = [options.skip] if isinstance(options.skip, str) else list(options.skip)
    state = load_teacher_state(teacher)
    values, notes = weight_selection_values(model, state, skip=skip, strict=options.strict)
    write_values(model, values)
    desc = (
        type(teacher).__name__
        if isinstance(teacher, nn.Module)
        else (os.fspath(teacher) if isinstance(teacher, str | os.PathLike) else f"state_dict({len(state)} tensors)")
    )
    return InitResult(options={**as_dict(options), "teacher": desc, "skip": skip}, notes=notes)
