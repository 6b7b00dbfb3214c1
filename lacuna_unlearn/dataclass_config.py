"""The one configuration system of ``lacuna``: dataclass defaults, preset YAML files, one override grammar.

Every default of ``lacuna run`` and ``lacuna build-testbed`` is a dataclass field (``run_config.RunConfig``,
``testbed_presets.TestbedConfig``), registered in Hydra's ``ConfigStore`` as a structured config (group
``lacuna``). A preset is a YAML file in ``presets/<kind>/`` holding only what differs from those defaults. Files
and ``--set key=value`` overrides (Hydra's grammar, the same as ``lacuna attack --set`` and ``lacuna-unlearn``) are
applied onto the structured config one setting at a time, each checked against the field's declared type before
any work (docs/guide.md "Configuration: presets and overrides").

The type check is strict (``yes`` is not ``true``, ``"50"`` is not ``50``): OmegaConf alone would coerce both.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PRESET_DIR",
    "apply_settings",
    "check_value",
    "config_choices",
    "parse_overrides",
    "preset_names",
    "preset_path",
    "read_yaml",
    "structured",
]

#: Preset YAML files: ``presets/run/<name>.yaml`` and ``presets/testbed/<name>.yaml`` (package data).
PRESET_DIR = Path(__file__).with_name("presets")
#: ``lacuna-unlearn``'s Hydra config groups (method, attack, experiment, trainer).
HYDRA_CONFIGS = Path(__file__).with_name("configs")


def preset_names(kind: str) -> list[str]:
    """The presets of ``kind`` (``run`` or ``testbed``): the YAML files' names. Reads the directory only (no
    YAML, no OmegaConf), so the CLI derives its ``--preset`` choices without slowing ``lacuna tasks path``."""
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def preset_path(kind: str, name: str) -> Path:
    """The YAML file of preset ``name``; ``ValueError`` naming the known presets."""
    if name not in preset_names(kind):
        raise ValueError(f"unknown {kind} preset {name!r}; choose from {preset_names(kind)}")
    return PRESET_DIR / kind / f"{name}.yaml"


def config_choices(group: str) -> list[str]:
    """The configs of a ``lacuna-unlearn`` Hydra group (``attack``: the relearning protocols, ``method``)."""
    return sorted(p.stem for p in (HYDRA_CONFIGS / group).glob("*.yaml"))


# -- the override grammar -----------------------------------------------------------------------------------------


def path_override(key: str, path: Any) -> str:
    """``key='path'`` for a Hydra override: quoted, so a path with spaces or non-ASCII characters (which Hydra's
    grammar refuses unquoted) reaches the app as the string it is. In Hydra's quoted strings a backslash is literal
    except before a quote or the closing quote, so only those runs are doubled."""
    import re

    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, str(path)).replace("'", "\\'")
    return f"{key}='{text}'"


def parse_overrides(items: Iterable[str], flag: str = "--set") -> dict[str, Any]:
    """``key=value`` items as ``{dotted key: value}``, in Hydra's override grammar: values are typed
    (``50``, ``1e-3``, ``true``, ``null``, ``[email,phone]``, ``{a: 1}``, ``'quoted=text'``), exactly as
    ``lacuna attack --set`` and ``lacuna-unlearn`` read them. A JSON value Hydra's grammar cannot read (an object
    with quoted keys) is read as JSON, so the ``--set`` values of earlier releases keep working. Sweeps
    (``a=1,2``), ``+``/``~`` prefixes and functions are refused, naming the item."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects key=value, got {item!r}")
        try:
            override = parser.parse_override(item)
        except HydraException as exc:
            try:
                out[key.strip()] = json.loads(text)
                continue
            except json.JSONDecodeError:
                pass
            if not text.isascii() and not any(c in text for c in "[]{}(),'\"=*"):
                # Hydra's grammar has no unquoted non-ASCII characters (a path such as /data/résumé): a plain value
                # of them is read as the string it is
                out[key.strip()] = text
                continue
            hint = " (quote a value that holds '=': ['a.b=1'])" if "=" in text else ""
            raise ValueError(f"{flag} {item}: {str(exc).splitlines()[0]}{hint}") from None
        if override.type is not OverrideType.CHANGE or override.package is not None:
            raise ValueError(f"{flag} {item}: only key=value is supported here (no +, ++, ~ or @package)")
        if override.is_sweep_override():
            raise ValueError(f"{flag} {item}: a sweep is not a value; write a list as [a,b]")
        out[override.key_or_group] = _plain(override.value(), f"{flag} {item}")
    return out


def _plain(value: Any, where: str) -> Any:
    """Hydra's parsed value as plain Python (its lists and dicts are already plain; functions are not)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    raise ValueError(f"{where}: {type(value).__name__} values are not supported here")


# -- strict types from the dataclass fields -----------------------------------------------------------------------

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_PLURALS = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return f"a list of {_PLURALS.get(args[0], 'values')}" if args else "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    return _TYPE_NAMES.get(hint, str(hint))


def _optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` as ``(X, True)``; any other hint as ``(hint, False)``."""
    args = typing.get_args(hint)
    if type(None) in args and typing.get_origin(hint) is not list and typing.get_origin(hint) is not dict:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return hint, False


def check_value(where: str, hint: Any, value: Any) -> Any:
    """``value`` if it has the declared type ``hint`` (ints become floats where a number is declared); else
    ``ValueError`` ``"<where>: expected an integer, got 'abc'"``."""
    base, optional = _optional(hint)
    if value is None:
        if optional or base is Any:
            return None
        raise ValueError(f"{where}: got null, expected {_type_name(base)}")
    if base is Any:
        return value
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected {_type_name(base)}, got {value!r}")
        if args:
            try:
                return [check_value(where, args[0], v) for v in value]
            except ValueError:
                raise ValueError(f"{where}: expected {_type_name(base)}, got {value!r}") from None
        return value
    if origin is dict or dataclasses.is_dataclass(base):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        if origin is dict and args:  # a map field: every value has the declared type
            return {k: check_value(f"{where}.{k}", args[1], v) for k, v in value.items()}
        return value
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        str: lambda v: isinstance(v, str),
    }.get(base, lambda v: isinstance(v, base))(value)
    if not ok:
        raise ValueError(f"{where}: expected {_type_name(base)}, got {value!r}")
    return float(value) if base is float else value


# -- structured configs and settings ------------------------------------------------------------------------------


def structured(name: str, schema: type) -> Any:
    """A fresh OmegaConf structured config of ``schema``, stored once in Hydra's ``ConfigStore`` as
    ``lacuna/<name>`` (so a Hydra app can compose it) and copied from there."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.object_type import ObjectType

    store = ConfigStore.instance()
    if store.get_type(f"lacuna/{name}.yaml") is ObjectType.NOT_FOUND:
        store.store(group="lacuna", name=name, node=schema)
    return store.load(f"lacuna/{name}.yaml").node  # a deep copy


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML mapping; a read or syntax error becomes one line naming the file, line and column."""
    import yaml

    file = Path(path)
    try:
        loaded = yaml.load(file.read_text(encoding="utf-8"), Loader=_loader())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:  # one line: where in the file, and what
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{file}:{where} cannot read the {what}: {problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{file}: a {what} is a mapping, got {type(loaded).__name__}")
    return loaded


@functools.cache
def _loader() -> Any:
    """PyYAML's safe loader reading ``1e-3`` as a number (YAML 1.1 needs ``1.0e-3``), as OmegaConf does."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$|^[-+]?\.[0-9_]+(?:[eE][-+][0-9]+)?$"),
        list("-+0123456789."),
    )
    return Loader


def _hint(node: Any, key: str) -> Any:
    """The declared type of ``node[key]``: the dataclass field's, or a map field's value type."""
    from omegaconf import OmegaConf

    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        return typing.get_type_hints(schema)[key]
    return node._metadata.element_type


def _is_section(node: Any, key: str) -> bool:
    """``node[key]`` is a mapping (a dataclass section or a map field) that dotted keys can walk into."""
    from omegaconf import DictConfig, OmegaConf

    return key in node and isinstance(node._get_node(key), DictConfig) and not OmegaConf.is_missing(node, key)


def _is_map(node: Any) -> bool:
    """A map field (``methods``): its keys are the user's, and a new value replaces the whole map."""
    from omegaconf import OmegaConf

    return not dataclasses.is_dataclass(OmegaConf.get_type(node))


def apply_settings(
    cfg: Any,
    settings: Mapping[str, Any],
    *,
    kind: str,
    where: str | None = None,
    convert: Callable[[str, Any], Any] = lambda key, value: value,
) -> None:
    """Set each of ``settings`` on the structured config ``cfg``, checked against the schema.

    ``where=None``: ``settings`` are ``--set`` overrides with dotted keys (``attack.attempts``), each a plain
    assignment; errors start ``--set <key>:``. Else a YAML mapping read from ``where``: nested sections merge
    setting by setting, a map field (``methods``) is replaced whole; errors start ``<file>:<section>:<key>:``.
    Unknown keys and wrong types raise ``ValueError`` naming the key; ``convert(leaf, value)`` rewrites a value
    first (``fields: all``)."""
    for key, value in settings.items():
        if where is None:
            _set(cfg, str(key).split("."), value, kind=kind, label=f"--set {key}", section=f"--set {key}",
                 convert=convert)  # fmt: skip
        else:
            _merge(cfg, {key: value}, kind=kind, where=where, convert=convert)


def _merge(node: Any, mapping: Mapping[str, Any], *, kind: str, where: str, convert: Callable) -> None:
    for key, value in mapping.items():
        key = str(key)
        if key not in node and not _is_map(node):
            raise ValueError(f"{where}: unknown {kind} setting {key!r}; known: {sorted(node)}")
        if _is_section(node, key) and not _is_map(node[key]) and isinstance(value, Mapping):
            _merge(node[key], value, kind=kind, where=f"{where}:{key}", convert=convert)
        else:
            _set(node, [key], value, kind=kind, label=f"{where}:{key}", section=where, convert=convert)


def _set(node: Any, path: Sequence[str], value: Any, *, kind: str, label: str, section: str, convert: Callable) -> None:
    from omegaconf.errors import OmegaConfBaseException

    *parents, leaf = path
    for part in parents:
        if not _is_section(node, part):
            raise ValueError(f"{section}: {part!r} is not a section of the {kind} config")
        node = node[part]
    if leaf not in node and not _is_map(node):
        raise ValueError(f"{section}: unknown {kind} setting {leaf!r}; known: {sorted(node)}")
    value = check_value(label, _hint(node, leaf), convert(leaf, value))
    try:
        if _is_section(node, leaf) and not _is_map(node[leaf]):
            for sub, sub_value in value.items():  # a whole section: its settings one by one
                _set(node[leaf], [str(sub)], sub_value, kind=kind, label=f"{label}.{sub}", section=label,
                     convert=convert)  # fmt: skip
        else:
            node[leaf] = value
    except OmegaConfBaseException as exc:  # the schema's own check, should the strict one above let a value by
        raise ValueError(f"{label}: {str(exc).splitlines()[0]}") from None
