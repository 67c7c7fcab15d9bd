"""The recipe files shipped with impulsevit (data only: ``*.yaml``); the top-level ``recipes/`` of a source checkout is
a link to this folder. Looked up by name through :mod:`impulsevit.run.recipes`."""
