"""Initializers: pure functions over (nn.Module, torch.Generator). No Lightning imports in this package.

>>> import timm, impulsevit.init as ii
>>> m = timm.create_model("vit_tiny_patch16_224", weight_init="skip")
>>> report = ii.initialize(m, "impulse", generator=0)
>>> print(ii.summarize(ii.attention_maps(m), report.offsets))  # doctest: +SKIP

Method cards (sources, defaults, applicability, differences from released code): ``impulsevit/init/README.md``;
the method itself: ``docs/method.md``. Your own initializer: ``model.init.method: my_pkg.inits:my_init`` or an entry
point in the group ``impulsevit.initializers`` (:mod:`impulsevit.init.plugins`).
"""

from impulsevit.init.api import (
    InitReport,
    InitResult,
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
    target_logits,
    value_proj_factors,
)
from impulsevit.init.plugins import check_init_method, list_methods, resolve_method
from impulsevit.init.weight_selection import select_tensor, selection_indices

__all__ = [
    "AttentionMaps",
    "HeadSummary",
    "InitReport",
    "InitResult",
    "Summary",
    "attention_maps",
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
    "summarize",
    "target_logits",
    "value_proj_factors",
    "write_full_",
]
