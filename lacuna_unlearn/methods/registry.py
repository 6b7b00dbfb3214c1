"""The one registry of unlearning methods: ``method.name`` -> where its code and its defaults live.

Entries are ``"module:attribute"`` strings resolved on first use, so importing this module (the CLI's argument
checks, ``lacuna run``'s plan) does not import torch or any method module. Two kinds (docs/unlearning.md):

* ``method``: a :class:`lacuna_unlearn.methods.base.Method` dataclass that the trainer optimises
  (:func:`lacuna_unlearn.trainer.loop.unlearn`).
* ``editor``: a training-free method (closed-form edit, pruning; also the ``null_*`` noise controls, which are not
  unlearning methods). ``target`` is its ``run_from_config(model, forget_rows, retain_rows, out, args, *, seed,
  data)``, which writes an HF checkpoint.

``config`` is the method's settings dataclass (:mod:`lacuna_unlearn.methods.settings`, torch-free), which the
method class inherits: its field defaults are ``method.args``' defaults (:func:`store_method_configs`).

:data:`METHODS` and :data:`EDITORS` are read-only views of the same table.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULTS_GROUP",
    "EDITORS",
    "METHODS",
    "REGISTRY",
    "Entry",
    "config_class",
    "config_defaults",
    "lookup",
    "make_method",
    "resolve",
    "store_method_configs",
]


@dataclass(frozen=True)
class Entry:
    """One registered method: ``kind`` ("method" | "editor"), ``target`` (the Method class / the editor's
    entry function) and ``config`` (the dataclass whose field defaults are ``method.args``' defaults)."""

    kind: str
    target: str
    config: str


_SETTINGS = "lacuna_unlearn.methods.settings"


def _method(module: str, cls: str, settings: str = "MethodSettings") -> Entry:
    return Entry("method", f"lacuna_unlearn.methods.{module}:{cls}", f"{_SETTINGS}:{settings}")


def _editor(module: str, settings: str) -> Entry:
    return Entry("editor", f"lacuna_unlearn.methods.{module}:run_from_config", f"{_SETTINGS}:{settings}")


REGISTRY: dict[str, Entry] = {
    "grad_ascent": _method("grad_ascent", "GradAscent"),
    "grad_diff": _method("grad_diff", "GradDiff", "GradDiffSettings"),
    "npo": _method("npo", "NPO", "NPOSettings"),
    "simnpo": _method("simnpo", "SimNPO", "SimNPOSettings"),
    "rmu": _method("rmu", "RMU", "RMUSettings"),
    "jensun": _method("jensun", "JensUn", "JensUnSettings"),
    "rlabel": _method("rlabel", "RLabel", "RLabelSettings"),
    "undial": _method("undial", "UNDIAL", "UNDIALSettings"),
    "idk_dpo": _method("idk_dpo", "IdkDPO", "IdkDPOSettings"),
    "memflex": _method("memflex", "MemFlex", "MemFlexSettings"),  # LoRA parameters located by gradients (#memflex)
    "wagle": _method("wagle", "WAGLE", "WAGLESettings"),  # weight-attribution mask, then a gradient objective on it
    "finetune": _method("finetune", "Finetune"),  # the relearning attack's objective, not an unlearning method
    "frp": _editor("frp", "FRPSettings"),
    "alpha_edit": _editor("alpha_edit.edit", "AlphaEditSettings"),
    "selective_pruning": _editor("selective_pruning", "SPSettings"),
    # noise controls, not unlearning methods: a method-free update of a given size (docs/unlearning.md)
    "null_gaussian": _editor("method_free", "MethodFreeSettings"),
    "null_weight_decay": _editor("method_free", "NullWeightDecaySettings"),
}


def lookup(name: str, kind: str | None = None) -> Entry:
    """The entry of ``name`` (of ``kind`` if given); ValueError listing the known names otherwise."""
    entry = REGISTRY.get(name)
    if entry is None or (kind is not None and entry.kind != kind):
        known = sorted(n for n, e in REGISTRY.items() if kind is None or e.kind == kind)
        label = "method" if kind in (None, "method") else "training-free method"
        raise ValueError(f"unknown {label} {name!r}; available: {known}")
    return entry


def _load(path: str) -> Any:
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)


def resolve(name: str, kind: str | None = None) -> Any:
    """The registered object of ``name``: the Method class, or the editor's ``run_from_config``."""
    return _load(lookup(name, kind).target)


def config_class(name: str) -> type:
    """The settings dataclass of ``name`` (:mod:`lacuna_unlearn.methods.settings`, torch-free): its fields are
    ``method.args`` and their defaults."""
    return _load(lookup(name).config)


def config_defaults(name: str) -> dict[str, Any]:
    """``method.args`` defaults of ``name``: its settings dataclass's fields (lists are fresh copies) but those
    marked :data:`lacuna_unlearn.methods.settings.RUN_TIME` (JensUn's ``refusal_ids``). IdkDPO's ``refusal_ids``
    and the editors' ``seed`` (the run's top-level ``seed``) are fields of the method / config class, not settings."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config_class(name)):
        if f.metadata.get("method_args", True) is False:  # settings.RUN_TIME: filled by the method, not configured
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def make_method(name: str, **args: Any) -> Any:
    """Instantiate a registered trained method with its hyper-parameters; unknown names and arguments are errors."""
    cls = resolve(name, "method")
    try:
        return cls(**args)
    except TypeError as exc:
        raise ValueError(f"method {name!r}: {exc}") from None


class _View(Mapping[str, Any]):
    """Read-only name -> resolved object mapping over the registry entries of one kind."""

    def __init__(self, kind: str) -> None:
        self._kind = kind

    def __getitem__(self, name: str) -> Any:
        if name not in REGISTRY or REGISTRY[name].kind != self._kind:
            raise KeyError(name)
        return resolve(name)

    def __iter__(self) -> Iterator[str]:
        return (n for n, e in REGISTRY.items() if e.kind == self._kind)

    def __len__(self) -> int:
        return sum(e.kind == self._kind for e in REGISTRY.values())

    def __repr__(self) -> str:
        return f"<{self._kind} registry: {', '.join(self)}>"


#: Trained methods: name -> Method class (imported on access).
METHODS: Mapping[str, Any] = _View("method")
#: Training-free methods: name -> ``run_from_config`` (imported on access).
EDITORS: Mapping[str, Any] = _View("editor")


#: Hydra config group of the registered defaults: ``configs/method/<file>.yaml`` extends ``/method_defaults/<name>``.
DEFAULTS_GROUP = "method_defaults"


def store_method_configs() -> None:
    """Put every registered method's config node ``{name, restrict: none, args: <settings defaults>}`` into
    Hydra's ConfigStore (group :data:`DEFAULTS_GROUP`), so the dataclasses are the one source of the defaults and
    ``configs/method/*.yaml`` only name the method and override what differs. Imports only the torch-free settings
    module. The nodes are untyped: a wrong ``method.args`` key or type is reported by ``preflight`` /
    :func:`make_method` with one line, as before, not by Hydra. Idempotent."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name in REGISTRY:
        node = {"name": name, "restrict": "none", "args": config_defaults(name)}
        store.store(group=DEFAULTS_GROUP, name=name, node=node, provider="lacuna_unlearn")
