"""``python -m lacuna_unlearn ...``: the ``lacuna`` command (for ``accelerate launch -m lacuna_unlearn ...``)."""

import sys

from lacuna_unlearn.bench.cli.main import main

sys.exit(main())
