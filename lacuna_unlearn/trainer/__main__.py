"""``python -m lacuna_unlearn.trainer ...``: ``lacuna-unlearn``, the Hydra app (for ``accelerate launch -m``)."""

from lacuna_unlearn.trainer.app import main

main()
