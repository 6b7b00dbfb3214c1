"""The report of a ``lacuna run``: its markdown tables (tables.py), ``report.md`` (markdown.py) and its plots
(plots.py), beside the writer of ``results.json`` that they read (docs/report.md)."""
