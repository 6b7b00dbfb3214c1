"""Write an unlearned model so that a reader never sees half of it: build ``OUT.partial``, then rename."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["building", "publish_checkpoint"]


@contextmanager
def building(out: str | Path) -> Iterator[Path]:
    """Yield a fresh ``OUT.partial`` to write into; on success it replaces ``OUT`` (rename), on any error it is
    removed and the error re-raised, so a reader never sees half an output. A write error names its file at its
    place in ``OUT`` (``OUT`` itself when the writer named none: a full disk under ``save_pretrained``)."""
    from lacuna_metrics import naming_outputs, writing

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with naming_outputs(partial, out), writing(out):
            partial.mkdir(parents=True)
            yield partial
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def publish_checkpoint(model: Any, tokenizer: Any, out: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Save ``model`` + ``tokenizer`` (HF ``save_pretrained`` layout) and ``unlearn_manifest.json`` to ``out``,
    atomically (see :func:`building`). The manifest goes through :func:`lacuna_metrics.manifest.build_manifest`, so
    every checkpoint records the same ``versions`` and ``hardware`` whatever its method wrote."""
    from lacuna_metrics import build_manifest, write_json

    with building(out) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        write_json(partial / "unlearn_manifest.json", build_manifest(**manifest))
    return Path(out)
