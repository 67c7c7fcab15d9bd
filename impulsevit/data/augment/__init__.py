"""How training images are augmented: DeiT's per-image augmentations on batched tensors, run on the training device
(:mod:`.device`)."""
