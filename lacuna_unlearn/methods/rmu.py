"""RMU (docs/definitions.md#unlearning-losses): steer forget activations at one layer to c·u, keep retain activations at
the reference's.

Forget term: mean over forget answer tokens of (1/d)‖h_θ − c·u‖²; retain term (``embed_diff``): the same
MSE between h_θ and the frozen initial model's h_ref on retain answer tokens, or NLL / KL on the retain
logits. OpenUnlearning YAML defaults: c 2, γ 1, α 1, ``EMBED_DIFF``, layer ``model.layers.7`` (16 layers).

Choices (documented here because they differ in form, not in value, from OpenUnlearning's forward hook):

* h is ``model(..., output_hidden_states=True).hidden_states[layer + 1]`` (index 0 is the embeddings),
  i.e. the OUTPUT of block ``layer``. For every block but the last this is exactly what a forward hook on
  ``model.layers[layer]`` captures; for the last block HF returns the final-norm output instead.
* ``layer = -1`` (default) means the middle block ``(n_layers - 1) // 2``, resolved at the first call
  (and written back, so the manifest records it): 7 for a 16-layer model, OpenUnlearning's choice.
* Token mask: the answer tokens ``labels != -100``, unshifted (the hidden state AT each answer token),
  as OpenUnlearning; not the attention mask, so prompt and padding are not steered.
* u = :func:`rmu_control_vector` (``torch.rand(1, 1, d)`` from a generator seeded with ``seed``, unit
  norm), built once on the hidden states' device and cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import IGNORE_INDEX, rmu_control_vector, rmu_forget_loss, rmu_retain_loss
from lacuna_unlearn.methods.settings import RMUSettings

_RETAIN_TYPES = ("embed_diff", "nll", "kl")


def hidden_states(model: torch.nn.Module, batch, layer: int) -> torch.Tensor:  # noqa: ANN001
    """Output of transformer block ``layer`` (``hidden_states[layer + 1]``), shape [B, T, d]."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    return out.hidden_states[layer + 1]


@dataclass
class RMU(RMUSettings, GradDiff):
    def __post_init__(self) -> None:
        if self.retain_loss_type.lower() not in _RETAIN_TYPES:
            raise ValueError(f"retain_loss_type must be one of {_RETAIN_TYPES}, got {self.retain_loss_type!r}")
        if self.layer < -1:
            raise ValueError(f"layer must be a block index or -1 (middle block), got {self.layer}")
        self._control_vector: torch.Tensor | None = None  # not a dataclass field: stays out of asdict()

    def _layer(self, model: torch.nn.Module) -> int:
        n_layers = int(getattr(model, "module", model).config.num_hidden_layers)  # DDP wraps the model
        if self.layer == -1:
            self.layer = (n_layers - 1) // 2
        if not 0 <= self.layer < n_layers:
            raise ValueError(f"layer {self.layer} out of range for a model with {n_layers} blocks")
        return self.layer

    def control_vector(self, hidden: torch.Tensor) -> torch.Tensor:
        """u (unit norm, float32) on ``hidden``'s device, built from (d, seed) once."""
        u = self._control_vector
        if u is None or u.shape[-1] != hidden.shape[-1] or u.device != hidden.device:
            u = rmu_control_vector(hidden.shape[-1], self.seed).to(hidden.device)
            self._control_vector = u
        return u

    def forget_term(self, model, inputs) -> torch.Tensor:  # noqa: ANN001
        batch = inputs["forget"]
        hidden = hidden_states(model, batch, self._layer(model))
        return rmu_forget_loss(
            hidden, batch["labels"] != IGNORE_INDEX, self.control_vector(hidden), self.steering_coeff
        )

    def retain_term(self, model, inputs, ref_model) -> torch.Tensor:  # noqa: ANN001
        if self.retain_loss_type.lower() != "embed_diff":
            return super().retain_term(model, inputs, ref_model)
        batch = inputs["retain"]
        layer = self._layer(model)
        hidden = hidden_states(model, batch, layer)
        with torch.no_grad():
            ref_hidden = hidden_states(ref_model, batch, layer)
        return rmu_retain_loss(hidden, ref_hidden, batch["labels"] != IGNORE_INDEX)

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        forget = self.forget_term(model, inputs)
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
