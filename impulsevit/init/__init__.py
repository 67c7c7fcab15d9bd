"""Initializers: pure functions over (nn.Module, torch.Generator). No Lightning imports in this package.

>>> import timm, impulsevit.init as ii
>>> m = timm.create_model("vit_tiny_patch16_224", weight_init="skip")
>>> report = ii.initialize(m, "impulse", generator=0)
>>> print(ii.summarize(ii.attention_maps(m), report.offsets))  # doctest: +SKIP

Method cards (sources, defaults, applicability, differences from released code): ``impulsevit/init/README.md``;
the method itself: ``docs/method.md``. Your own initializer: a handler ``handler(model, generator, options)`` with a
frozen options dataclass, registered with ``@impulsevit.init.register`` in a module of yours that you import (from
Python) or name as a plugin (``impulsevit --plugins my_pkg.inits``, ``IMPULSEVIT_PLUGINS``, or an entry point of the
group ``impulsevit.plugins`` whose value is the module): ``impulsevit/init/README.md``, "One way to extend".

The built-in families are imported here, by name (:data:`BUILTIN_FAMILIES`), so that importing the package registers
their handlers — no module is imported at run time by the registry (:mod:`impulsevit.init.registry`).
"""

# the built-in family modules, imported for their @register calls (a new family file is added here;
# tests/house/test_layers.py fails for a module that registers without being listed)
# isort: off
from impulsevit.init import baselines, vit, weight_selection, convmixer, mixer, relbias, rope, swin  # noqa: F401
# isort: on
from impulsevit.init.api import (
    InitReport,
    InitResult,
    calibration_batch,
    calibration_size,
    initialize,
    is_dtensor,
    make_generator,
    methods,
    read_full,
    register,
    write_full_,
)
from impulsevit.init.diagnostics import (
    AttentionMaps,
    HeadSummary,
    Summary,
    attention_maps,
    register_attention_maps,
    summarize,
)
from impulsevit.init.impulse import (
    draw_noise,
    factor_pseudo_input,
    impulse_offsets,
    kernel_offsets,
    layer_norm_rows,
    mimetic_qk_factors,
    shift_index,
    solve_qk,
    solve_qk_calibrated,
    target_logits,
    value_proj_factors,
)
from impulsevit.init.plugins import check_init_method, list_methods, resolve_method
from impulsevit.init.weight_selection import select_tensor, selection_indices

BUILTIN_FAMILIES = ("baselines", "vit", "weight_selection", "convmixer", "mixer", "relbias", "rope", "swin")
"""The modules of this package that register handlers, imported above in this order, which is the dispatch order among
handlers of one method (their ``matches`` are disjoint but for the ``any`` family's methods, which no other family
registers)."""

__all__ = [
    "BUILTIN_FAMILIES",
    "AttentionMaps",
    "HeadSummary",
    "InitReport",
    "InitResult",
    "Summary",
    "attention_maps",
    "calibration_batch",
    "calibration_size",
    "draw_noise",
    "factor_pseudo_input",
    "impulse_offsets",
    "initialize",
    "is_dtensor",
    "kernel_offsets",
    "layer_norm_rows",
    "list_methods",
    "make_generator",
    "methods",
    "mimetic_qk_factors",
    "read_full",
    "register",
    "register_attention_maps",
    "check_init_method",
    "resolve_method",
    "select_tensor",
    "selection_indices",
    "shift_index",
    "solve_qk",
    "solve_qk_calibrated",
    "summarize",
    "target_logits",
    "value_proj_factors",
    "write_full_",
]
