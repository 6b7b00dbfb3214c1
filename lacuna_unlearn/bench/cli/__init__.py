"""The ``lacuna`` command: argument checks and the dispatcher."""
