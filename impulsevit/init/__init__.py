"""Initializers: pure functions over (nn.Module, torch.Generator). No Lightning imports in this package.

>>> import timm, impulsevit.init as ii
>>> m = timm.create_model("vit_tiny_patch16_224", weight_init="skip")
>>> report = ii.initialize(m, "impulse", generator=0)
"""

from impulsevit.init.api import InitReport, initialize, make_generator, methods, read_full, register, write_full_

__all__ = ["InitReport", "initialize", "make_generator", "methods", "read_full", "register", "write_full_"]
