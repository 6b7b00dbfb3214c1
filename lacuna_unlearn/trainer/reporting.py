"""``trainer.args.report_to``: which experiment trackers (HF ``Trainer`` integrations) a run logs to, resolved before
anything loads (torch-free: the CLI's preflight calls it).

HF semantics (a name, a list of names, ``none``, ``all``) with three differences, so that a run never talks to a
network service nobody named: the default is ``none``; ``all`` means the installed integrations that write only
local files (:data:`LOCAL_INTEGRATIONS`, today TensorBoard), not every installed one (HF's ``all`` would start W&B,
Trackio, Comet ... wherever their package happens to be installed); and a named integration whose package is not
installed is refused naming the pip package, instead of failing when the Trainer is built after the model loaded.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

__all__ = ["INTEGRATIONS", "LOCAL_INTEGRATIONS", "resolve_report_to"]

#: HF integration name -> (the modules it needs, each a tuple of alternatives, as transformers' ``is_*_available``
#: look for them; the pip package(s) to install).
INTEGRATIONS: dict[str, tuple[tuple[tuple[str, ...], ...], str]] = {
    "tensorboard": ((("tensorboard", "tensorboardX"),), "tensorboard"),
    "wandb": ((("wandb",),), "wandb"),
    "trackio": ((("trackio",),), "trackio"),
    "mlflow": ((("mlflow",),), "mlflow"),
    "comet_ml": ((("comet_ml",),), "comet-ml"),
    "clearml": ((("clearml",),), "clearml"),
    "dvclive": ((("dvclive",),), "dvclive"),
    "swanlab": ((("swanlab",),), "swanlab"),
    "neptune": ((("neptune",),), "neptune"),
    "codecarbon": ((("codecarbon",),), "codecarbon"),
    "azure_ml": ((("azureml.core.run",),), "azureml-core"),
    "dagshub": ((("dagshub",), ("mlflow",)), "dagshub mlflow"),
}
#: What ``report_to=all`` may enable: integrations that only write files under the run (no account, no network).
LOCAL_INTEGRATIONS: tuple[str, ...] = ("tensorboard",)


def _installed(name: str) -> bool:
    """Whether every module ``name`` needs can be found (one of each group of alternatives)."""
    needs, _ = INTEGRATIONS[name]
    for group in needs:
        found = False
        for module in group:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package missing (azureml.core.run)
                found = False
            if found:
                break
        if not found:
            return False
    return True


def resolve_report_to(value: Any, logging_dir: Any = None) -> list[str]:
    """``trainer.args.report_to`` as the list of integrations to pass to ``TrainingArguments``: ``none`` / null / []
    give [], ``all`` the installed :data:`LOCAL_INTEGRATIONS`; a name or a list of names must be known and installed.
    ``logging_dir`` (``trainer.args.logging_dir``) is a path or None, and only given with TensorBoard. ValueError
    naming the key (and the pip package of a missing integration) otherwise."""
    report = _resolve(value)
    if logging_dir is not None:
        if not isinstance(logging_dir, str) or not logging_dir:
            raise ValueError(f"trainer.args.logging_dir must be a directory path or null, got {logging_dir!r}")
        if "tensorboard" not in report:
            raise ValueError(
                f"trainer.args.logging_dir={logging_dir!r} is where TensorBoard writes; add tensorboard to "
                "trainer.args.report_to or drop logging_dir"
            )
    return report


def _resolve(value: Any) -> list[str]:
    """:func:`resolve_report_to` without ``logging_dir``."""
    names = [value] if isinstance(value, str) else value
    if names is None:
        return []
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"trainer.args.report_to must be a name or a list of names, got {value!r}")
    if len(names) == 1 and names[0] in ("none", "all"):
        if names[0] == "none":
            return []
        local = [n for n in LOCAL_INTEGRATIONS if _installed(n)]
        if not local:
            warnings.warn(
                f"trainer.args.report_to=all: none of the local integrations {list(LOCAL_INTEGRATIONS)} is installed "
                "(pip install tensorboard), so nothing is reported; network ones (wandb, trackio, ...) must be named",
                stacklevel=2,
            )
        return local
    choices = ["none", "all", *INTEGRATIONS]
    for name in names:  # the names first, then whether their packages are installed
        if name in ("none", "all"):
            raise ValueError(f"trainer.args.report_to: {name!r} cannot be combined with other names, got {value!r}")
        if name not in INTEGRATIONS:
            raise ValueError(f"trainer.args.report_to: {name!r} is not a reporting integration; choose from {choices}")
    for name in names:
        if not _installed(name):
            raise ValueError(f"trainer.args.report_to: {name} is not installed (pip install {INTEGRATIONS[name][1]})")
    return list(dict.fromkeys(names))
