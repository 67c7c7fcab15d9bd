"""How images are stored: FFCV ``.beton`` conversion (:mod:`.convert`, the library; :mod:`.convert_cli`, ``impulsevit
convert``), storage presets (:mod:`.presets`), the manifest next to each ``.beton`` (:mod:`.manifest`), integrity checks
(:mod:`.integrity`) and the cross-process lock file (:mod:`.locking`). No Lightning here."""
