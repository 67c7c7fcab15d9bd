"""How images are read during training: the datamodule interface (:mod:`.base`), :class:`ImageDataModule`
(:mod:`.datamodule`) over one of two backends (:mod:`.backends` the interface and the resolved settings,
:mod:`.ffcv_backend`, :mod:`.torchvision_backend`) with its typed blocks (:mod:`.config`), the loader position and the
one reader of the trainer (:mod:`.position`), the FFCV loader (:mod:`.ffcv_loader`) and its PIL-exact resampler
(:mod:`.resample`; its filter constants in :mod:`.filters`, free of numba), resumable sample orders
(:mod:`.sampling`) and synthetic data for tests (:mod:`.synthetic`)."""
