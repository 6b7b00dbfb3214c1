"""The benchmark product: ``lacuna run`` and its stages, attacks, the gate, the run report and the ``lacuna`` CLI."""
