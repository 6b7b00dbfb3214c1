"""Write an unlearned model so that a reader never sees half of it: build ``OUT.partial``, then rename."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["publish_checkpoint"]


def publish_checkpoint(model: Any, tokenizer: Any, out: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Save ``model`` + ``tokenizer`` (HF ``save_pretrained`` layout) and ``unlearn_manifest.json`` to ``out``.

    Everything is written into ``<out>.partial`` first and renamed at the end (an existing ``out`` is replaced);
    on any error the partial directory is removed and the error re-raised.
    """
    from lacuna_metrics.manifest import write_json

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        write_json(partial / "unlearn_manifest.json", dict(manifest))
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out
