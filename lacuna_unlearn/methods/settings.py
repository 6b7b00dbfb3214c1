"""The hyper-parameters of every registered method, one dataclass each: the single source of their defaults.

Each method class inherits its settings (``class NPO(GradDiff, NPOSettings)``; the editors' ``FRPConfig`` etc. add
their ``seed`` and checks), so these fields are the method's dataclass fields and ``asdict(method)`` is unchanged.
Kept free of torch: :func:`lacuna_unlearn.methods.registry.store_method_configs` turns them into Hydra's
``/method_defaults/<name>`` nodes, which ``configs/method/*.yaml`` extend, at every config composition, and a bad
``lacuna-unlearn`` override must still fail in about a second (docs/unlearning.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "RUN_TIME",
    "SP_EPS",
    "AlphaEditSettings",
    "FRPSettings",
    "GradDiffSettings",
    "IdkDPOSettings",
    "JensUnSettings",
    "MemFlexSettings",
    "MethodFreeSettings",
    "MethodSettings",
    "NPOSettings",
    "NullWeightDecaySettings",
    "RLabelSettings",
    "RMUSettings",
    "SPSettings",
    "SimNPOSettings",
    "UNDIALSettings",
    "WAGLESettings",
]

# ------------------------------------------------------------------------------------------------------------------
# Trained methods (lacuna_unlearn.methods.base.Method subclasses)


@dataclass
class MethodSettings:
    """Every trained method: ``gamma`` weighs the forget term, ``alpha`` the retain term
    (docs/definitions.md#unlearning-losses). GradAscent and Finetune have no others."""

    gamma: float = 1.0
    alpha: float = 1.0


@dataclass
class GradDiffSettings(MethodSettings):
    retain_loss_type: str = "nll"  # "nll" | "kl" | "jsd"


@dataclass
class NPOSettings(GradDiffSettings):
    beta: float = 0.1


@dataclass
class SimNPOSettings(GradDiffSettings):
    gamma: float = 0.125
    beta: float = 4.5
    delta: float = 0.0


@dataclass
class RMUSettings(GradDiffSettings):
    layer: int = -1  # block whose output is steered; -1 = middle block, resolved at the first call
    steering_coeff: float = 2.0
    seed: int = 42
    retain_loss_type: str = "embed_diff"  # "embed_diff" | "nll" | "kl"


#: ``field`` metadata of a field filled at run time, not a ``method.args`` setting (left out of the Hydra defaults).
RUN_TIME = {"method_args": False}


@dataclass
class JensUnSettings(GradDiffSettings):
    refusal: str = " No idea"
    #: the tokenized refusal, filled by ``JensUn.prepare(tokenizer)`` unless given explicitly (kept at this position:
    #: the order of ``asdict``, i.e. of the manifests' ``method_args``)
    refusal_ids: tuple[int, ...] = field(default=(), metadata=RUN_TIME)
    legacy_unmasked: bool = False  # True: the paper-time variant (all positions, unnormalised target)
    retain_loss_type: str = "jsd"  # "jsd" | "kl" | "nll"


@dataclass
class RLabelSettings(GradDiffSettings):
    seed: int = 42


@dataclass
class UNDIALSettings(GradDiffSettings):
    alpha: float = 0.0
    beta: float = 10.0
    masked: bool = True  # False: OpenUnlearning's form (all positions, prompt and padding included)


@dataclass
class IdkDPOSettings(GradDiffSettings):
    beta: float = 0.1
    refusal: str = "I don't know."
    openunlearning_scale: bool = False  # True: OpenUnlearning's 2/beta factor


@dataclass
class MemFlexSettings(MethodSettings):
    forget_factor: float = -0.6  # weight of the forget rows' NLL (negative: ascent)
    retain_factor: float = 2.0  # weight of the retain rows' NLL
    cos_threshold: float = 0.92  # located iff cos(g_unlearn, g_retain) < this ...
    grad_threshold: float = 6e-4  # ... and mean|g_unlearn| > this (LACUNA 7B: 1e-5)
    locate_batch_size: int = 8  # rows per gradient batch in the localisation (LACUNA batch_size)
    random_labels: bool = True  # localise on randomly relabelled answers, as the code does
    seed: int = 42  # of the random relabelling


@dataclass
class WAGLESettings(MethodSettings):
    objective: str = "grad_diff"  #: "grad_diff" | "npo"
    beta: float = 0.1  #: NPO's beta (ignored by grad_diff)
    retain_loss_type: str = "nll"  #: "nll" | "kl" | "jsd", the objective's retain term
    ratio: float = 0.8  #: fraction of candidate scalars trained (INFERRED default, see lacuna_unlearn/methods/wagle.py)
    mu: float = 1e-6  #: Hessian-diagonal constant of the score (INFERRED default)
    target: str = "linear"  #: candidates: "linear" | "all" | "mlp" | "params"
    scope: str = "global"  #: "global" | "per_tensor" top-k
    batch_size: int = 8  #: batch size of the attribution gradient passes


# ------------------------------------------------------------------------------------------------------------------
# Training-free methods (editors); their ``seed`` is the run's top-level ``seed``, added by the config classes


@dataclass
class FRPSettings:
    """FRP hyper-parameters (docs/definitions.md#frp); defaults = Table 1: λ 0.05, ρ 0.03, no veto, zeroing, MLP,
    400 seqs."""

    rho: float = 0.03  #: fraction of each row's d_in entries pruned (k = int(rho * d_in))
    lam: float = 0.05  #: the paper's λ (code ``--beta``): weight of rank(|W|)
    beta: float = 0.0  #: the paper's β (code ``--protect_p``): fraction of each row vetoed by P; 0 = no veto
    shrink: float = 0.0  #: pruned weights are multiplied by this (0.0 = set to zero)
    target: str = "mlp"  #: "mlp" (gate/up/down), "all" (7 projections) or "linear"
    calib_samples: int = 400  #: calibration sequences per side (the first n of the texts passed)
    max_length: int = 256  #: tokens per calibration sequence


#: Selective Pruning's eps (FRAG's; taker: 1e-3).
SP_EPS = 1e-5


@dataclass
class SPSettings:
    """Selective Pruning hyper-parameters (defaults: FRAG's Table 1 baseline, see
    lacuna_unlearn/methods/selective_pruning.py)."""

    frac: float = 0.05  #: fraction of MLP neurons pruned (global: of all blocks' neurons)
    eps: float = SP_EPS  #: s_j = I^f_j / (I^r_j + eps)
    scope: str = "global"  #: "global" | "per_layer"
    mode: str = "neuron"  #: "neuron" (gate/up rows + down column) | "down" (down column only)
    calib_samples: int = 400  #: calibration sequences per side (the first n of the texts passed), as FRP
    max_length: int = 256  #: tokens per calibration sequence


@dataclass
class AlphaEditSettings:
    """AlphaEdit hyper-parameters; defaults = LACUNA's 1B row of docs/definitions.md#lacuna-unlearning-hyper-parameters
    (the mini preset overrides layers)."""

    layers: list[int] = field(default_factory=lambda: [4, 5, 6, 7, 8])
    target: str = "I don't know."
    #: edited module per layer (an nn.Linear or Conv1D), a template like ``model.layers.{}.mlp.down_proj``; ``auto``:
    #: the layer's MLP output projection, from the model anatomy (docs/anatomy.md)
    module: str = "auto"
    #: whose output is the residual stream at ``layers[-1]``; ``auto``: the transformer block (``model.layers.{}``)
    block: str = "auto"
    v_num_grad_steps: int = 50
    v_lr: float = 5e-2
    v_weight_decay: float = 1.0
    clamp_norm_factor: float = 0.5
    kl_factor: float = 1.0
    l2: float = 1.0  #: LACUNA's "L2": weight of the identity in the solve
    nullspace_threshold: float = 1e-3
    #: False: eigenvalues below ``nullspace_threshold`` (AlphaEdit). True: below threshold x the largest eigenvalue,
    #: for models whose key scale differs from the LLMs AlphaEdit was tuned on (the mini testbed's smallest is ~68).
    nullspace_relative: bool = False
    batch_size: int = 5  #: requests per sequential edit
    fact_token: str = "subject_last"  #: where keys/values are read: "subject_last" (LACUNA) or "last"
    context_templates: list[str] = field(default_factory=lambda: ["{}"])
    kl_prompt: str = "{} is a"
    #: preserved-knowledge keys: "retain" (the retain split's QA text), "neutral" (the testbed's trained neutral
    #: corpus, never its held-out slice: the neutral-perplexity probe's text)
    cov_text: list[str] = field(default_factory=lambda: ["retain", "neutral"])
    cov_files: list[str] = field(default_factory=list)  #: extra text files, one text per line
    cov_samples: int = 100_000  #: at most this many preserved-knowledge texts
    max_length: int = 256


@dataclass
class MethodFreeSettings:
    """A method-free update of a given size (``null_gaussian``, ``null_weight_decay``;
    lacuna_unlearn/methods/method_free.py): a noise control, not an unlearning method. It ignores the forget and retain
    rows. These defaults are ``null_gaussian``'s."""

    kind: str = "gaussian"  #: "gaussian" (N(0, 1), scaled per tensor) | "weight_decay" (-size x theta, no draws)
    size: float = 0.01  #: ||delta||_2 / ||theta||_2 of every tensor in scope, before rounding to the stored dtype
    #: the tensors updated: a FRAG target (lacuna_metrics.frag.targets), as ``linear_weight_names`` reads it; "all":
    #: the 2-D projection weights of the transformer blocks (embeddings, lm_head, norms and biases unchanged)
    scope: str = "all"


@dataclass
class NullWeightDecaySettings(MethodFreeSettings):
    """``null_weight_decay``: :class:`MethodFreeSettings` with ``kind="weight_decay"`` (the registry gives a name
    its dataclass's defaults, so the second name's default kind needs its own class)."""

    kind: str = "weight_decay"
