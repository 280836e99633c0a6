"""Argo's expression languages (its ``util/template``, ``util/expr``), knowing nothing of a run.

- :mod:`.substitution`: ``{{...}}`` tags; :mod:`.conditions`: ``when`` and ``depends``
  (govaluate's grammar); :mod:`.expr_lang`: expr-lang (``{{=...}}``); :mod:`.jsonpath`: its
  ``jsonpath()``, matching Go's library; :mod:`.gojson`: Go's JSON formatting of values.
"""
