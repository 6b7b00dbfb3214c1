"""Model anatomy: which tensors of a decoder-only causal LM are the projections of its transformer blocks.

The one answer in the package to "is this weight attention, MLP, an expert or a router, of which layer, in which
role, stored which way round": the masks (``component``, the eligible pattern), FRAG (which weights are scored),
LoRA (the default targets) and the diagnostics (the list of blocks) all ask here, so a new architecture is taught
once. ``docs/anatomy.md`` has the rules, the supported layouts and what is left out.

Two views of the same model: :func:`model_anatomy` reads a loaded ``nn.Module``, where the **structure** decides
what is a projection (every ``nn.Linear`` / ``Conv1D`` / 3-D expert parameter inside the ``nn.ModuleList`` of
``config.num_hidden_layers`` blocks) and the names only give component and role (:func:`classify_name`; unmatched:
``"other"``); :func:`checkpoint_anatomy` reads a checkpoint's tensor names and shapes and its ``config.json``,
where the names decide everything (the view of mask files and of the scorer, which never load a model). The two
can name the same weights differently (transformers 5 keeps Mixtral's experts fused in memory but saves per-expert
matrices); :attr:`Weight.input_key` links them.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

__all__ = [
    "ATTENTION_ROLES",
    "COMPONENTS",
    "EXPERT_PARAMETER_ROLES",
    "MLP_NEURON_ROLES",
    "MLP_OUTPUT_ROLES",
    "MLP_ROLES",
    "PROJECTION_WEIGHT_PATTERN",
    "Anatomy",
    "Weight",
    "checkpoint_anatomy",
    "classify_name",
    "find_blocks",
    "is_linear_module",
    "layer_of",
    "linear_weights",
    "model_anatomy",
    "num_layers_of",
]

#: ``other``: a linear module inside a block whose names match no rule (structure-based views only).
COMPONENTS: tuple[str, ...] = ("attention", "mlp", "expert", "router", "other")

# -- name rules ---------------------------------------------------------------------------------------------
# A block tensor is ``<prefix>.<list>.<N>.<containers...>.<leaf>.<weight|bias>`` (or, for fused experts,
# ``...experts.<leaf>`` with the parameter itself named like a projection).

#: Names of the ``nn.ModuleList`` that holds the blocks (``model.layers``, ``transformer.h``, ``...blocks``).
BLOCK_LISTS: tuple[str, ...] = ("layers", "h", "blocks")
_BLOCK_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")

ATTENTION_CONTAINERS: tuple[str, ...] = ("self_attn", "attn", "attention", "self_attention")
MLP_CONTAINERS: tuple[str, ...] = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")
SHARED_EXPERT_CONTAINERS: tuple[str, ...] = ("shared_expert", "shared_experts", "shared_mlp")
#: Leaves of a router: ``gate`` directly inside an MLP container (Mixtral, Qwen2-MoE), ``router``, ...
ROUTER_LEAVES: tuple[str, ...] = ("router", "shared_expert_gate")

#: Attention projection leaf -> role. ``qkv`` is a fused q/k/v projection (GPT-NeoX, Falcon, BLOOM, Phi-3, GPT-2).
ATTENTION_ROLES: dict[str, str] = {
    "q_proj": "q",
    "query": "q",
    "k_proj": "k",
    "key": "k",
    "v_proj": "v",
    "value": "v",
    "o_proj": "o",
    "out_proj": "o",
    "dense": "o",
    "c_proj": "o",
    "wo": "o",
    "qkv_proj": "qkv",
    "query_key_value": "qkv",
    "c_attn": "qkv",
    "Wqkv": "qkv",
    "wqkv": "qkv",
}
#: MLP / expert projection leaf -> role. ``gate_up`` is fused gate and up (Phi-3, MoE experts); ``fc_in`` /
#: ``fc_out`` are the two matrices of an ungated MLP (GPT-2, GPT-NeoX, OPT, Falcon, BLOOM).
MLP_ROLES: dict[str, str] = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
    "gate_up_proj": "gate_up",
    "fc1": "fc_in",
    "c_fc": "fc_in",
    "dense_h_to_4h": "fc_in",
    "fc_in": "fc_in",
    "fc2": "fc_out",
    "c_proj": "fc_out",
    "dense_4h_to_h": "fc_out",
    "fc_out": "fc_out",
}
#: Leaves allowed directly under a block (no container), e.g. OPT's ``layers.N.fc1``.
_BARE_MLP_LEAVES: tuple[str, ...] = ("fc1", "fc2", "fc_in", "fc_out")
#: Names of fused 3-D expert parameters (``...experts.gate_up_proj``), and their ``_bias`` companions.
EXPERT_PARAMETER_ROLES: dict[str, str] = {
    "gate_up_proj": "gate_up",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}
#: What each role reads: the component's input (``in``), the attention output (``attn_out``, for ``o``) or the
#: MLP's intermediate activation (``mid``, for ``down`` / ``fc_out``).
_INPUT_KIND: dict[str, str] = {
    **dict.fromkeys(("q", "k", "v", "qkv", "gate", "up", "gate_up", "fc_in", "router"), "in"),
    **{"o": "attn_out", "down": "mid", "fc_out": "mid"},
}
#: An MLP's output projection (its input channels are the MLP's hidden neurons) and the roles whose output channels
#: are those neurons, one each (fused ``gate_up``: the gate half, then the up half).
MLP_OUTPUT_ROLES: tuple[str, ...] = ("down", "fc_out")
MLP_NEURON_ROLES: tuple[str, ...] = ("gate", "up", "fc_in")
#: Leaves of transformers ``Conv1D`` layers (GPT-2 family), stored ``(d_in, d_out)``.
_CONV1D_LEAVES: tuple[str, ...] = ("c_attn", "c_proj", "c_fc")
_CONV1D_MODEL_TYPES: tuple[str, ...] = ("gpt2", "openai-gpt", "imagegpt", "decision_transformer")
_LAYER_KEYS: tuple[str, ...] = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_KEYS: tuple[str, ...] = ("hidden_size", "n_embd", "d_model")


def _alternation(names: Iterable[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(set(names), key=lambda s: (-len(s), s)))


def _projection_pattern() -> str:
    """The name rules as one regex: 2-D attention, MLP and per-expert projection weights of a block (no routers,
    no fused 3-D experts, no biases, norms, embeddings or ``lm_head``)."""
    block = r"(?:layers|h|blocks)\.\d+\."
    attention = rf"(?:{_alternation(ATTENTION_CONTAINERS)})\.(?:{_alternation(ATTENTION_ROLES)})"
    expert = rf"(?:experts\.\d+\.|(?:{_alternation(SHARED_EXPERT_CONTAINERS)})\.)?"
    mlp = rf"(?:{_alternation(MLP_CONTAINERS)})\.{expert}(?:{_alternation(MLP_ROLES)})"
    bare = rf"(?:{_alternation(_BARE_MLP_LEAVES)})"
    return rf"(?:^|\.){block}(?:{attention}|{mlp}|{bare})\.weight$"


#: The name rules as a regex (``re.search``): the 2-D attention, MLP and per-expert projection weights of a block.
#: On Llama / OLMo-2 / Qwen2 / Mistral / Gemma-2, GPT-NeoX and GPT-2 names it matches exactly the seven (four)
#: projections per block that the masks have always covered; it adds Phi-3's fused ``qkv_proj`` /
#: ``gate_up_proj``, OPT's ``out_proj`` / ``fc1`` / ``fc2``, Falcon and BLOOM (``self_attention``), per-expert
#: matrices (``experts.E.w1``, ``experts.E.gate_proj``) and shared experts.
PROJECTION_WEIGHT_PATTERN: str = _projection_pattern()


@dataclass(frozen=True)
class Weight:
    """One projection tensor of a transformer block (a weight matrix, or the bias of one).

    ``expert`` is the expert index of a per-expert tensor; a fused 3-D tensor (``fused_experts``) holds every
    expert along dim 0 and has ``expert=None``. ``transposed`` means stored ``(d_in, d_out)`` (GPT-2 ``Conv1D``;
    ``[E, d_in, d_out]`` for fused experts) instead of ``nn.Linear``'s ``(d_out, d_in)``. ``module`` is the
    module that owns the tensor, ``hook`` how its input can be observed (``"linear"``: the module's first
    input; ``"experts"``: a fused experts module; ``""``: only named, not seen in a model).
    """

    name: str
    layer: int | None
    component: str
    role: str
    kind: str = "weight"
    shape: tuple[int, ...] = ()
    expert: int | None = None
    fused_experts: bool = False
    transposed: bool = False
    module: str = ""
    hook: str = ""

    @property
    def is_matrix(self) -> bool:
        """A weight with an input axis (2-D, or 3-D fused experts): what FRAG and the coverage count."""
        return self.kind == "weight" and len(self.shape) >= 2

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def input_dim(self) -> int | None:
        """Length of the input axis (d_in), or None for biases and unknown shapes."""
        if not self.is_matrix:
            return None
        return int(self.shape[-2] if self.transposed else self.shape[-1])

    @property
    def input_key(self) -> tuple[Any, ...]:
        """``(layer, component, expert, input)``: weights with equal keys read the same input activations."""
        return (self.layer, self.component, self.expert, _INPUT_KIND.get(self.role, self.role))


def layer_of(name: str) -> int | None:
    """Block index N of ``...layers.N....`` / ``...h.N....`` / ``...blocks.N....``; None outside the blocks."""
    m = _BLOCK_RE.search(name)
    return int(m.group(1)) if m else None


def _split(name: str) -> tuple[int, list[str], str, str] | None:
    """(layer, containers, leaf, kind) of a block tensor name, or None when it is not a projection's name."""
    m = _BLOCK_RE.search(name)
    if m is None:
        return None
    parts = name[m.end() :].split(".")
    if len(parts) >= 2 and parts[-1] in ("weight", "bias"):
        return int(m.group(1)), parts[:-2], parts[-2], parts[-1]
    if len(parts) >= 2 and parts[-2] == "experts":  # fused experts: ``experts.gate_up_proj`` / ``..._bias``
        leaf, kind = parts[-1], "weight"
        if leaf.endswith("_bias"):
            leaf, kind = leaf[: -len("_bias")], "bias"
        if leaf in EXPERT_PARAMETER_ROLES:
            return int(m.group(1)), parts[:-1], leaf, kind
    return None


def _component_role(containers: list[str], leaf: str) -> tuple[str, str, int | None] | None:
    """(component, role, expert index) from the path inside a block, or None (norms, rotary buffers, ...)."""
    if "norm" in leaf.lower():
        return None
    if "experts" in containers:
        at = containers.index("experts")
        nxt = containers[at + 1] if at + 1 < len(containers) else None
        role = MLP_ROLES.get(leaf) or (leaf if leaf.endswith("_proj") else None)
        if role is None:
            return None
        return "expert", role, int(nxt) if nxt is not None and nxt.isdigit() else None
    if leaf in ROUTER_LEAVES or (leaf == "gate" and containers and containers[-1] in MLP_CONTAINERS):
        return "router", "router", None
    if any(c in SHARED_EXPERT_CONTAINERS for c in containers) or (containers and containers[0] in MLP_CONTAINERS):
        role = MLP_ROLES.get(leaf) or (leaf if leaf.endswith("_proj") else None)
        return ("mlp", role, None) if role else None
    if containers and containers[0] in ATTENTION_CONTAINERS:
        role = ATTENTION_ROLES.get(leaf) or (leaf if leaf.endswith("_proj") else None)
        return ("attention", role, None) if role else None
    if not containers and leaf in _BARE_MLP_LEAVES:
        return "mlp", MLP_ROLES[leaf], None
    return None


def classify_name(name: str, shape: Iterable[int] | None = None) -> Weight | None:
    """The :class:`Weight` a tensor name denotes by the name rules alone (weights and biases), or None.

    None for norms (OLMo-2's ``q_norm`` included), embeddings, ``lm_head`` and anything outside the blocks.
    ``shape``, when given, is recorded and tells a fused 3-D expert tensor from a per-expert one. Whether a
    2-D weight is stored transposed cannot be read from its name; :func:`checkpoint_anatomy` decides it.
    """
    split = _split(name)
    if split is None:
        return None
    layer, containers, leaf, kind = split
    found = _component_role(containers, leaf)
    if found is None:
        return None
    component, role, expert = found
    dims = tuple(int(d) for d in shape) if shape is not None else ()
    fused = component == "expert" and expert is None and containers[-1:] == ["experts"]
    if fused and kind == "weight" and dims and len(dims) != 3:
        fused = False
    return Weight(
        name=name,
        layer=layer,
        component=component,
        role=role,
        kind=kind,
        shape=dims,
        expert=expert,
        fused_experts=fused,
        module=name.rsplit(".", 1)[0],
    )


# -- config --------------------------------------------------------------------------------------------------


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(config))


def _lookup(config: Mapping[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    text = config.get("text_config")
    if isinstance(text, Mapping):
        return _lookup(text, keys)
    return None


def num_layers_of(config: Any, source: str) -> int:
    """The number of transformer blocks: ``num_hidden_layers`` (or ``n_layer`` / ``num_layers``, or the same in
    ``text_config``) of a ``config.json`` dict or a transformers config. ValueError naming ``source`` when absent.
    """
    if config is not None and not isinstance(config, Mapping):
        text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
        value = getattr(text, "num_hidden_layers", None)
    else:
        value = _lookup(_config_dict(config), _LAYER_KEYS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = "missing" if value is None else repr(value)
        raise ValueError(
            f"{source}: config has no usable num_hidden_layers ({shown}; also looked for n_layer / num_layers): "
            f"cannot tell how many transformer blocks the model has"
        )
    return value


def _hidden_size(config: Mapping[str, Any]) -> int | None:
    value = _lookup(config, _HIDDEN_KEYS)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- anatomy -------------------------------------------------------------------------------------------------


@dataclass
class Anatomy:
    """The classified projection tensors of one model (or checkpoint), in model / file order.

    ``weights`` maps each projection tensor (weights and biases) to its :class:`Weight`; ``block_tensors``
    maps every tensor inside a block, projection or not (norms, unrecognised tensors), to its shape;
    ``block_list`` is the module path of the blocks (``model.layers``) when known.
    """

    source: str
    num_layers: int
    weights: dict[str, Weight] = field(default_factory=dict)
    block_tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    block_list: str | None = None

    def matrices(self) -> list[Weight]:
        """The projection weights with an input axis (2-D, or 3-D fused experts)."""
        return [w for w in self.weights.values() if w.is_matrix]

    def block_matrix_names(self) -> list[str]:
        """Every tensor of a block with two or more dimensions, except projection biases: the "block weights"
        whose share FRAG's coverage reports (1-D norms and biases have no input axis to weigh)."""
        biases = {n for n, w in self.weights.items() if w.kind == "bias"}
        return [n for n, s in self.block_tensors.items() if len(s) >= 2 and n not in biases]

    def select(self, target: str) -> list[Weight]:
        """The projection weights of a FRAG target: ``all``, ``attention``, ``mlp`` (MLP and experts, not
        routers), ``expert`` or ``regex:PATTERN`` (``re.search`` on the tensor names)."""
        matrices = self.matrices()
        if target == "all":
            return matrices
        if target == "attention":
            return [w for w in matrices if w.component == "attention"]
        if target == "mlp":
            return [w for w in matrices if w.component in ("mlp", "expert")]
        if target == "expert":
            return [w for w in matrices if w.component == "expert"]
        if target.startswith("regex:"):
            regex = re.compile(target.removeprefix("regex:"))
            return [w for w in matrices if regex.search(w.name)]
        raise ValueError(f"unknown target {target!r}; expected all, attention, mlp, expert or regex:PATTERN")

    def counts(self) -> dict[str, Any]:
        """Projection weights per component and per (layer, component), for tests and reports."""
        per_component = Counter(w.component for w in self.matrices())
        per_layer = Counter((w.layer, w.component) for w in self.matrices())
        return {
            "num_layers": self.num_layers,
            "layers": sorted({w.layer for w in self.matrices() if w.layer is not None}),
            "components": dict(per_component),
            "per_layer": {f"{layer}/{comp}": n for (layer, comp), n in sorted(per_layer.items(), key=str)},
        }

    def summary(self) -> str:
        """One line: ``2 blocks: attention 8, mlp 6``."""
        parts = ", ".join(f"{c} {n}" for c, n in sorted(self.counts()["components"].items()))
        return f"{self.num_layers} blocks: {parts or 'no projection weights'}"


@functools.cache
def _conv1d_type() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return Conv1D


def is_linear_module(module: torch.nn.Module) -> bool:
    """``nn.Linear`` (subclasses included) or transformers ``Conv1D``: the modules whose 2-D weight is a projection."""
    return isinstance(module, torch.nn.Linear) or is_transposed_module(module)


def is_transposed_module(module: torch.nn.Module) -> bool:
    """A transformers ``Conv1D`` (GPT-2 family): its weight is stored ``(d_in, d_out)``, not ``nn.Linear``'s."""
    conv1d = _conv1d_type()
    return conv1d is not None and isinstance(module, conv1d)


def linear_weights(model: torch.nn.Module) -> list[Weight]:
    """Every ``nn.Linear`` / ``Conv1D`` with a 2-D weight in the whole model except the embeddings and ``lm_head``,
    in model order (FRAG's ``linear`` target): blocks or not, classified by the name rules when they match
    (component ``other`` and the leaf as role when not)."""
    excluded: set[int] = set()
    for getter in ("get_output_embeddings", "get_input_embeddings"):
        fn = getattr(model, getter, None)
        module = fn() if callable(fn) else None
        if isinstance(module, torch.nn.Module):
            excluded.add(id(module))
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor):
                excluded.add(id(weight))
    found: list[Weight] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not is_linear_module(module) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if id(module) in excluded or id(weight) in excluded or leaf == "lm_head" or "embed" in name:
            continue
        named = classify_name(f"{name}.weight")
        found.append(
            Weight(
                name=f"{name}.weight",
                layer=layer_of(f"{name}.weight"),
                component=named.component if named else "other",
                role=named.role if named else leaf,
                shape=tuple(weight.shape),
                transposed=is_transposed_module(module),
                module=name,
                hook="linear",
            )
        )
    return found


def find_blocks(model: torch.nn.Module, num_layers: int | None = None) -> tuple[str, torch.nn.ModuleList]:
    """The ``nn.ModuleList`` of transformer blocks and its module path (``model.layers``, ``transformer.h``).

    It is the list of ``num_layers`` modules (default: the model config's ``num_hidden_layers``) that holds
    parameters; among several, the one named like a block list, then the one with the most parameters.
    ValueError naming the model when there is none.
    """
    who = type(model).__name__
    if num_layers is None:
        num_layers = num_layers_of(getattr(model, "config", None), who)
    candidates: list[tuple[bool, int, str, torch.nn.ModuleList]] = []
    for name, module in model.named_modules():
        if not name or not isinstance(module, torch.nn.ModuleList) or len(module) != num_layers:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size:
            candidates.append((name.rsplit(".", 1)[-1] in BLOCK_LISTS, size, name, module))
    if not candidates:
        raise ValueError(
            f"{who}: no list of {num_layers} transformer blocks found (num_hidden_layers={num_layers}); "
            f"not a decoder-only causal LM with its blocks in one nn.ModuleList"
        )
    _, _, name, module = max(candidates, key=lambda c: (c[0], c[1]))
    return name, module


def _fused_transposed(flag: Any, role: str, shape: tuple[int, ...], hidden: int | None) -> bool:
    """Whether a fused ``[E, ., .]`` expert tensor is stored ``[E, d_in, d_out]``: the experts module says so
    (``flag``: transformers' ``is_transposed``), else the hidden size tells which axis is the input."""
    if isinstance(flag, bool):
        return flag
    if hidden is None or len(shape) != 3:
        return False
    reads_hidden = _INPUT_KIND.get(role) == "in"
    if reads_hidden:
        return shape[2] != hidden and shape[1] == hidden
    return shape[1] != hidden and shape[2] == hidden


def model_anatomy(model: torch.nn.Module, source: str | None = None) -> Anatomy:
    """Classify the block tensors of a loaded model from its module structure (see the module docstring).

    ValueError naming ``source`` (default: the model class) when the config has no ``num_hidden_layers`` or
    no list of that many blocks exists.
    """
    who = source or type(model).__name__
    config = getattr(model, "config", None)
    n = num_layers_of(config, who)
    try:
        prefix, blocks = find_blocks(model, n)
    except ValueError as exc:
        raise ValueError(f"{who}: {str(exc).split(': ', 1)[-1]}") from None
    hidden = _hidden_size(_config_dict(config.get_text_config() if hasattr(config, "get_text_config") else config))
    anatomy = Anatomy(source=who, num_layers=n, block_list=prefix)
    seen: set[int] = set()
    for i, block in enumerate(blocks):
        for sub, module in block.named_modules():
            module_name = f"{prefix}.{i}" + (f".{sub}" if sub else "")
            for pname, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                full = f"{module_name}.{pname}"
                shape = tuple(param.shape)
                anatomy.block_tensors[full] = shape
                weight = _classify_module_param(module, module_name, full, pname, shape, i, hidden)
                if weight is not None:
                    anatomy.weights[full] = weight
    return anatomy


def _classify_module_param(
    module: torch.nn.Module,
    module_name: str,
    full: str,
    pname: str,
    shape: tuple[int, ...],
    layer: int,
    hidden: int | None,
) -> Weight | None:
    named = classify_name(full, shape)
    if is_linear_module(module) and pname in ("weight", "bias"):
        base = named or Weight(name=full, layer=layer, component="other", role=module_name.rsplit(".", 1)[-1])
        return replace(
            base,
            kind=pname,
            shape=shape,
            transposed=is_transposed_module(module) and pname == "weight",
            fused_experts=False,
            module=module_name,
            hook="linear",
        )
    if len(shape) == 3 and pname in EXPERT_PARAMETER_ROLES:
        base = named or Weight(name=full, layer=layer, component="expert", role=EXPERT_PARAMETER_ROLES[pname])
        role = base.role
        return replace(
            base,
            component="expert",
            kind="weight",
            shape=shape,
            expert=None,
            fused_experts=True,
            transposed=_fused_transposed(getattr(module, "is_transposed", None), role, shape, hidden),
            module=module_name,
            hook="experts",
        )
    if named is not None and named.fused_experts and named.kind == "bias":
        return replace(named, module=module_name, hook="experts")
    if named is not None and pname == "weight" and len(shape) == 2 and named.component == "router":
        # A router module that is not an nn.Linear (transformers 5 ``MixtralTopKRouter``): input = hidden states.
        if hidden is None or shape[1] == hidden:
            return replace(named, shape=shape, module=module_name, hook="linear")
    return None


def checkpoint_anatomy(shapes: Mapping[str, Iterable[int]], config: Mapping[str, Any] | None, source: str) -> Anatomy:
    """Classify a checkpoint's tensors from their names (see :func:`classify_name`) and its ``config.json``.

    ValueError naming ``source`` when the config has no ``num_hidden_layers`` or no tensor name has a block index
    (``...layers.N.``, ``...h.N.``, ``...blocks.N.``). 2-D ``Conv1D`` weights are recognised by the model type
    (GPT-2 family) or by their shape against the hidden size; fused 3-D experts by the hidden size.
    """
    cfg = _config_dict(config)
    n = num_layers_of(cfg, source)
    hidden = _hidden_size(cfg)
    anatomy = Anatomy(source=source, num_layers=n)
    dims = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    for name, shape in dims.items():
        if layer_of(name) is not None:
            anatomy.block_tensors[name] = shape
    if not anatomy.block_tensors:
        examples = ", ".join(list(dims)[:4]) or "<no tensors>"
        raise ValueError(
            f"{source}: no transformer blocks recognised: no tensor is named '...layers.N.', '...h.N.' or "
            f"'...blocks.N.' (e.g. {examples})"
        )
    conv1d = cfg.get("model_type") in _CONV1D_MODEL_TYPES
    for name, shape in anatomy.block_tensors.items():
        weight = classify_name(name, shape)
        if weight is None:
            continue
        if weight.fused_experts and weight.kind == "weight":
            weight = replace(weight, transposed=_fused_transposed(None, weight.role, shape, hidden))
        elif weight.kind == "weight" and len(shape) == 2 and name.rsplit(".", 2)[-2] in _CONV1D_LEAVES:
            if conv1d or (hidden is not None and _reads_rows(weight, shape, hidden)):
                weight = replace(weight, transposed=True)
        anatomy.weights[name] = weight
    return anatomy


def _reads_rows(weight: Weight, shape: tuple[int, ...], hidden: int) -> bool:
    """Shape evidence of a ``(d_in, d_out)`` weight: a hidden-reading projection with ``d_in`` first."""
    if _INPUT_KIND.get(weight.role) == "in":
        return shape[0] == hidden and shape[1] != hidden
    if _INPUT_KIND.get(weight.role) == "mid":
        return shape[1] == hidden and shape[0] != hidden
    return False
