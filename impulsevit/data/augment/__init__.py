"""How training images are augmented: DeiT's per-image augmentations on batched tensors, run on the training device,
split as timm splits its own: the shared per-image ops (:mod:`.ops`), RandAugment (:mod:`.rand_augment`), colour
jitter (:mod:`.color_jitter`), random erasing (:mod:`.random_erasing`), the CPU / accelerator evaluation strategies
(:mod:`.strategy`) and the chain the datamodule runs (:mod:`.device`)."""
