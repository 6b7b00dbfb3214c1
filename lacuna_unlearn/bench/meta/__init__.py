"""``lacuna meta``: the meta-evaluation over a ``lacuna run``'s pool of unlearned models (docs/meta.md)."""

from lacuna_unlearn.bench.meta.run import MetaSettings, run_meta

__all__ = ["MetaSettings", "run_meta"]
