"""How images are read during training: the datamodule interface (:mod:`.base`), :class:`ImageDataModule`
(:mod:`.datamodule`) with its typed blocks (:mod:`.config`), the FFCV loader (:mod:`.ffcv_loader`) and its PIL-exact
resampler (:mod:`.resample`), resumable sample orders (:mod:`.sampling`) and synthetic data for tests
(:mod:`.synthetic`)."""
