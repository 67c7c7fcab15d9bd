"""Where images come from: the dataset registry (:mod:`.registry`), the readers of each dataset's real on-disk format
(:mod:`.formats`), the indexable source every reader returns (:mod:`.image_source`) and ``impulsevit download``
(:mod:`.download`). No Lightning here."""
