"""``python -m impulsevit.study`` = ``impulsevit study``."""

from impulsevit.study.launch import main

raise SystemExit(main())
