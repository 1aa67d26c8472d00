"""The multi-task bi-encoder: transformer trunk + mean pooling, shared adapter, one head per objective.

Shapes: texts -> trunk -> pooled ``(n, H)`` -> adapter ``(n, H)`` (residual bottleneck MLP,
Houlsby et al. 2019; the up-projection starts at zero so the untrained adapter is the
identity) -> heads -> blocks ``{name: (n, d_k)}``, each L2-normalised, concatenated in
layout order to ``(n, D)``.

``architecture: esp`` gives every objective its own head and block (Embedding Subspace
Partitioning). ``architecture: single_head`` is the baseline: one head writes one shared
vector and every objective's loss reads all of it. The intent objective classifies with a
cosine classifier (``scale * cos(z, prototype_c)``) from the vector its loss reads, so intent
similarity between two texts is meaningful at serving time.

Trunk modes: ``frozen`` (no trunk gradients; pooled features may be cached, see
:mod:`training.features`), ``top:N`` (only the top N transformer layers train), ``full``.
Shared parameters (what gradient surgery works on) are the trainable trunk layers, the
adapter and, for ``single_head``, the head; :meth:`ESPModel.task_parameters` are the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the PyTorch convention)
from torch import nn

from subspace import encoder_format
from subspace.layout import SubspaceLayout

SINGLE_HEAD = "shared"

_TOP = re.compile(r"^top:(\d+)$")


@dataclass(frozen=True)
class TrunkMode:
    """``frozen``, ``full`` or ``top:N`` (N >= 1 trainable top layers)."""

    kind: str
    top: int = 0

    @classmethod
    def parse(cls, text: str) -> TrunkMode:
        if text in ("frozen", "full"):
            return cls(text)
        m = _TOP.match(text)
        if m and int(m.group(1)) >= 1:
            return cls("top", int(m.group(1)))
        raise ValueError(f"trunk mode {text!r} is invalid; allowed: 'frozen', 'full', 'top:N' (N >= 1)")

    def __str__(self) -> str:
        return f"top:{self.top}" if self.kind == "top" else self.kind


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of token states over the attention mask: ``(n, L, H), (n, L) -> (n, H)``."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class Trunk(nn.Module):
    """A Hugging Face encoder + its tokenizer, mean pooled, with the trainable part chosen by mode."""

    def __init__(self, model: Any, tokenizer: Any, *, max_length: int, mode: TrunkMode) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.mode = mode
        self.hidden_size = int(model.config.hidden_size)
        for p in self.model.parameters():
            p.requires_grad_(mode.kind == "full")
        if mode.kind == "top":
            layers = self._layers()
            if mode.top > len(layers):
                raise ValueError(f"trunk mode top:{mode.top} but the trunk has only {len(layers)} layers")
            for layer in layers[-mode.top :]:
                for p in layer.parameters():
                    p.requires_grad_(True)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, max_length: int, mode: TrunkMode) -> Trunk:
        from transformers import AutoModel, AutoTokenizer

        model = AutoModel.from_pretrained(str(path), use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(model, tokenizer, max_length=max_length, mode=mode)

    def _layers(self) -> nn.ModuleList:
        enc = getattr(self.model, "encoder", None)
        layers = getattr(enc, "layer", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError("trunk mode top:N needs a BERT-like model with encoder.layer")
        return layers

    @property
    def frozen(self) -> bool:
        return self.mode.kind == "frozen"

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """Pooled features ``(n, H)``; with gradients only through the trainable layers."""
        device = next(self.model.parameters()).device
        batch = {k: v.to(device) for k, v in self.tokenize(texts).items()}
        if self.frozen:
            self.model.eval()
            with torch.no_grad():
                out = self.model(**batch)
        else:
            out = self.model(**batch)
        return mean_pool(out.last_hidden_state, batch["attention_mask"])

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: Any = None) -> np.ndarray:
        """Pooled features of many texts, ``(n, H)`` float32, batched by length (less padding)."""
        was_training = self.model.training
        self.model.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.hidden_size), dtype=np.float32)
        try:
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                out[idx] = self.forward([texts[i] for i in idx]).float().cpu().numpy()
                if progress is not None:
                    progress.update(len(idx))
        finally:
            self.model.train(was_training)
        return out


class Adapter(nn.Module):
    """Residual bottleneck MLP ``x + W2 gelu(W1 x)``; ``W2 = 0`` at start (identity)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, hidden)
        self.up = nn.Linear(hidden, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.gelu(self.down(x)))


class ESPModel(nn.Module):
    """Trunk + optional adapter + heads + (optional) cosine intent classifier.

    ``layout`` is what the bundle will carry: the ESP layout, or for ``single_head`` one block
    named ``shared``. ``objectives`` maps every objective name to the vector its loss reads.
    """

    def __init__(
        self,
        trunk: Trunk,
        objective_dims: dict[str, int],
        *,
        architecture: str = "esp",
        adapter_hidden: int | None = None,
        intent_objective: str | None = None,
        intent_classes: Sequence[str] | None = None,
        cosine_scale: float = 16.0,
        default_weights: dict[str, float] | None = None,
        losses: dict[str, str] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if architecture not in ("esp", "single_head"):
            raise ValueError(f"architecture {architecture!r} is invalid; allowed: 'esp', 'single_head'")
        gen = torch.Generator().manual_seed(seed)
        self.trunk = trunk
        self.architecture = architecture
        self.objective_names = list(objective_dims)
        h = trunk.hidden_size
        self.adapter = Adapter(h, adapter_hidden) if adapter_hidden else None
        if architecture == "esp":
            head_dims = dict(objective_dims)
            self.layout = SubspaceLayout.from_dims(head_dims, losses=losses, default_weights=default_weights)
        else:
            head_dims = {SINGLE_HEAD: sum(objective_dims.values())}
            self.layout = SubspaceLayout.from_dims(head_dims, losses={SINGLE_HEAD: "multi_task"})
        self.heads = nn.ModuleDict({n: nn.Linear(h, d) for n, d in head_dims.items()})
        for head in self.heads.values():
            assert isinstance(head, nn.Linear)
            _orthogonal_(head.weight, gen)
            nn.init.zeros_(head.bias)
        self.intent_objective = intent_objective
        self.intent_classes = list(intent_classes) if intent_classes else None
        self.cosine_scale = float(cosine_scale)
        if intent_objective is not None:
            if not self.intent_classes:
                raise ValueError(f"intent objective {intent_objective!r} needs intent_classes")
            d = self.layout[self._block_of(intent_objective)].dim
            proto = torch.randn(len(self.intent_classes), d, generator=gen)
            self.prototypes: nn.Parameter | None = nn.Parameter(F.normalize(proto, dim=-1))
        else:
            self.prototypes = None

    # --- parameter groups ---------------------------------------------------------------
    def _block_of(self, objective: str) -> str:
        return objective if self.architecture == "esp" else SINGLE_HEAD

    def shared_parameters(self) -> list[nn.Parameter]:
        """Parameters more than one objective's loss depends on (what PCGrad projects)."""
        params = list(self.trunk.trainable_parameters())
        if self.adapter is not None:
            params += list(self.adapter.parameters())
        if self.architecture == "single_head":
            params += list(self.heads[SINGLE_HEAD].parameters())
        return params

    def task_parameters(self, objective: str) -> list[nn.Parameter]:
        """Parameters only ``objective``'s loss depends on (never projected)."""
        params: list[nn.Parameter] = []
        if self.architecture == "esp":
            params += list(self.heads[objective].parameters())
        if objective == self.intent_objective and self.prototypes is not None:
            params.append(self.prototypes)
        return params

    # --- forward ------------------------------------------------------------------------
    def pooled(self, texts: Sequence[str]) -> torch.Tensor:
        return self.trunk(texts)

    def blocks(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-block L2-normalised outputs ``{block: (n, d_k)}`` from pooled features."""
        x = self.adapter(pooled) if self.adapter is not None else pooled
        return {name: F.normalize(head(x), dim=-1) for name, head in self.heads.items()}

    def objective_vector(self, pooled: torch.Tensor, objective: str) -> torch.Tensor:
        """The normalised vector objective ``objective``'s loss reads, ``(n, d)``."""
        x = self.adapter(pooled) if self.adapter is not None else pooled
        return F.normalize(self.heads[self._block_of(objective)](x), dim=-1)

    def intent_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Cosine classifier: ``scale * <z/|z|, p_c/|p_c|>``, ``(n, d) -> (n, C)``."""
        if self.prototypes is None:
            raise ValueError("this model has no intent objective")
        return self.cosine_scale * F.normalize(z, dim=-1) @ F.normalize(self.prototypes, dim=-1).T

    def embed_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        blocks = self.blocks(pooled)
        return torch.cat([blocks[n] for n in self.layout.names], dim=-1)

    # --- inference ----------------------------------------------------------------------
    @torch.inference_mode()
    def encode_pooled(self, pooled: np.ndarray, batch_size: int = 4096) -> np.ndarray:
        """Block-normalised embeddings ``(n, D)`` float32 from pooled trunk features ``(n, H)``."""
        was = self.training
        self.eval()
        device = self.device
        try:
            parts = [
                self.embed_pooled(torch.from_numpy(pooled[i : i + batch_size]).to(device)).float().cpu()
                for i in range(0, len(pooled), batch_size)
            ]
        finally:
            self.train(was)
        if not parts:
            return np.zeros((0, self.layout.dim), dtype=np.float32)
        return torch.cat(parts).numpy().astype(np.float32, copy=False)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embed arbitrary texts: ``(n, D)`` float32, every block L2-normalised."""
        return self.encode_pooled(self.trunk.encode(list(texts), batch_size=batch_size))

    @torch.inference_mode()
    def intent_probs_pooled(self, pooled: np.ndarray) -> np.ndarray:
        if self.intent_objective is None:
            raise ValueError("this model has no intent objective")
        was = self.training
        self.eval()
        try:
            x = torch.from_numpy(pooled).to(self.device)
            z = self.objective_vector(x, self.intent_objective)
            probs = torch.softmax(self.intent_logits(z), dim=-1)
        finally:
            self.train(was)
        return probs.float().cpu().numpy()

    def intent_probs(self, texts: Sequence[str]) -> np.ndarray:
        """Softmax intent probabilities ``(n, C)`` in the order of :attr:`intent_classes`."""
        return self.intent_probs_pooled(self.trunk.encode(list(texts)))

    @property
    def device(self) -> torch.device:
        return next(self.heads.parameters()).device

    # --- serialisation ------------------------------------------------------------------
    def encoder_config(self) -> dict[str, Any]:
        """The JSON the service's ``QueryEncoder`` reads (see ``encoder/query_encoder.py``)."""
        intent = None
        if self.intent_objective is not None:
            intent = {
                "objective": self.intent_objective,
                "block": self._block_of(self.intent_objective),
                "classes": self.intent_classes,
                "scale": self.cosine_scale,
            }
        h = self.trunk.hidden_size
        return {
            "format": encoder_format.FORMAT,
            "format_version": encoder_format.FORMAT_VERSION,
            "architecture": self.architecture,
            "objectives": self.objective_names,
            "pooling": "mean",
            "max_length": self.trunk.max_length,
            "hidden_size": h,
            "adapter": (
                None
                if self.adapter is None
                else {
                    "kind": "residual_bottleneck",
                    "in": h,
                    "hidden": self.adapter.down.out_features,
                    "activation": "gelu",
                }
            ),
            "heads": [{"name": n, "in": h, "out": head.out_features} for n, head in self.heads.items()],
            "layout": self.layout.to_dict(),
            "intent": intent,
            "normalize": "per_block",
        }

    def head_tensors(self) -> dict[str, torch.Tensor]:
        t: dict[str, torch.Tensor] = {}
        if self.adapter is not None:
            t.update({f"adapter.{k}": v for k, v in self.adapter.state_dict().items()})
        for name, head in self.heads.items():
            t.update({f"heads.{name}.{k}": v for k, v in head.state_dict().items()})
        if self.prototypes is not None:
            t["intent.prototypes"] = self.prototypes.detach()
        return {k: v.detach().float().cpu().contiguous() for k, v in t.items()}

    def save_encoder(self, out_dir: str | Path) -> Path:
        """Write the query encoder folder: transformer/ + esp_encoder.json + heads.safetensors."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model: Any = self.trunk.model
        model.save_pretrained(str(out / encoder_format.TRANSFORMER_DIR), safe_serialization=True)
        self.trunk.tokenizer.save_pretrained(str(out / encoder_format.TRANSFORMER_DIR))
        save_file(self.head_tensors(), str(out / encoder_format.HEADS_FILE))
        config = json.dumps(self.encoder_config(), indent=2)
        (out / encoder_format.CONFIG_FILE).write_text(config, encoding="utf-8")
        return out


def _orthogonal_(weight: torch.Tensor, gen: torch.Generator) -> None:
    """Seeded (semi-)orthogonal init: an untrained head is a random isometry-like projection."""
    rows, cols = weight.shape
    a = torch.randn(max(rows, cols), min(rows, cols), generator=gen)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    with torch.no_grad():
        weight.copy_(q if rows >= cols else q.T)
