"""The multi-task bi-encoder: transformer trunk + mean pooling, shared adapter, one head per objective.

Shapes: texts -> trunk -> pooled ``(n, H)`` -> adapter ``(n, H)`` (residual bottleneck MLP,
Houlsby et al. 2019; the up-projection starts at zero so the untrained adapter is the
identity) -> heads -> blocks ``{name: (n, d_k)}``, each L2-normalised, concatenated in
layout order to ``(n, D)``.

``architecture: esp`` gives every objective its own head and block (Embedding Subspace
Partitioning). ``architecture: single_head`` is the baseline with the same heads, the same
initialisation and the same data: the heads' normalised outputs are concatenated into one
vector (one block, ``shared``) and every objective's loss reads all of it, so the two differ
only in the partition (and therefore in the serving-time knob).

Heads (``HeadSpec``): ``linear`` reads the adapter output; ``init: identity`` (``dim == H``)
starts the block as the trunk's own embedding, so training can only add a residual to
zero-shot quality. ``lexical`` reads hashed word n-gram counts (:mod:`esp_retrieval.subspace.lexical`)
through learned per-bucket weights initialised to the corpus IDF: a TF-IDF match of words
and word pairs that a mean-pooled embedding blurs (entity names). The intent objective classifies with a
cosine classifier (``scale * cos(z, prototype_c)``) from the vector its loss reads, so intent
similarity between two texts is meaningful at serving time.

Trunk modes: ``frozen`` (no trunk gradients; pooled features may be cached, see
:mod:`esp_retrieval.training.features`), ``top:N`` (only the top N transformer layers train), ``full``,
and ``query_top:N``: the top N layers train on the query side only (an asymmetric bi-encoder,
:mod:`esp_retrieval.training.query_tower`): passages keep the frozen trunk's cached features,
queries run the trained layers over cached hidden states from below them.
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

from esp_retrieval.subspace import encoder_format
from esp_retrieval.subspace.atomic import make_readable
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.lexical import HashedNgrams

SINGLE_HEAD = "shared"

_TOP = re.compile(r"^(top|query_top):(\d+)$")


@dataclass(frozen=True)
class TrunkMode:
    """``frozen``, ``full``, ``top:N`` (N >= 1 trainable top layers) or ``query_top:N`` (the top N
    layers train for queries only; passages stay at the frozen trunk's features)."""

    kind: str
    top: int = 0

    @classmethod
    def parse(cls, text: str) -> TrunkMode:
        if text in ("frozen", "full"):
            return cls(text)
        m = _TOP.match(text)
        if m and int(m.group(2)) >= 1:
            return cls(m.group(1), int(m.group(2)))
        raise ValueError(
            f"trunk mode {text!r} is invalid; allowed: 'frozen', 'full', 'top:N', 'query_top:N' (N >= 1)")

    @property
    def query_only(self) -> bool:
        """True for ``query_top:N``: passages are embedded by the frozen trunk (cached features)."""
        return self.kind == "query_top"

    def __str__(self) -> str:
        return f"{self.kind}:{self.top}" if self.kind in ("top", "query_top") else self.kind


#: sentence-transformers' config of a model folder: ``max_seq_length`` is what it encodes at
ST_CONFIG = "sentence_bert_config.json"


def own_max_length(path: str | Path, tokenizer: Any) -> int:
    """The sequence length a model is run at: ``max_seq_length`` of its sentence-transformers
    config (256 for all-MiniLM-L6-v2, which sentence-transformers and MTEB use), else the
    tokenizer's ``model_max_length`` when it is a real limit, else 512."""
    st = Path(path) / ST_CONFIG
    if st.is_file():
        value = json.loads(st.read_text(encoding="utf-8")).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit <= 100_000 else 512


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
        if mode.kind in ("top", "query_top"):
            layers = self.layers()
            if mode.top > len(layers):
                raise ValueError(f"trunk mode {mode} but the trunk has only {len(layers)} layers")
            for layer in layers[-mode.top :]:
                for p in layer.parameters():
                    p.requires_grad_(True)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, max_length: int | None, mode: TrunkMode) -> Trunk:
        """``max_length=None``: the model's own sequence length (:func:`own_max_length`)."""
        from transformers import AutoModel, AutoTokenizer

        model = AutoModel.from_pretrained(str(path), use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        length = own_max_length(path, tokenizer) if max_length is None else max_length
        return cls(model, tokenizer, max_length=length, mode=mode)

    def layers(self) -> nn.ModuleList:
        """The transformer layers, bottom first (``encoder.layer`` of a BERT-like model)."""
        enc = getattr(self.model, "encoder", None)
        layers = getattr(enc, "layer", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError("trunk modes top:N and query_top:N need a BERT-like model with encoder.layer")
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


@dataclass(frozen=True)
class HeadSpec:
    """How one objective's block is computed: ``linear`` (``init``: orthogonal | identity | pca) or
    ``lexical`` (hashed n-grams, :class:`subspace.lexical.HashedNgrams` with ``n_features = dim``);
    ``trainable: false`` keeps the initialisation (a frozen identity head is the trunk itself).

    ``pca`` starts a linear head at the top ``dim`` principal directions of its objective's
    training inputs (:meth:`ESPModel.init_pca`, called by ``esp_retrieval.training.run.build_run``; orthogonal
    until then). ``normalize_input`` feeds the head the L2-normalised pooled vector, which is
    the sentence embedding all-MiniLM-L6-v2 ships (its last module normalises), not the raw mean.
    """

    kind: str = "linear"
    init: str = "orthogonal"
    ngram_max: int = 2
    stop_words: str | None = "english"
    trainable: bool = True
    normalize_input: bool = False

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head kind {self.kind!r} is invalid; allowed: {sorted(HEAD_KINDS)}")
        if self.init not in HEAD_INITS:
            raise ValueError(f"head init {self.init!r} is invalid; allowed: {list(HEAD_INITS)}")


class LinearHead(nn.Module):
    """``(n, H) adapter output -> (n, d)``; orthogonal or identity initialisation, zero bias
    (``pca``: orthogonal until :meth:`init_pca`). ``normalize_input``: reads ``x / |x|``."""

    def __init__(
        self, h: int, d: int, init: str, gen: torch.Generator, normalize_input: bool = False
    ) -> None:
        super().__init__()
        self.normalize_input = normalize_input
        self.linear = nn.Linear(h, d)
        nn.init.zeros_(self.linear.bias)
        if init == "identity":
            if d != h:
                raise ValueError(f"head init 'identity' needs dim == trunk hidden size {h}, got {d}")
            with torch.no_grad():
                self.linear.weight.copy_(torch.eye(h))
        else:
            _orthogonal_(self.linear.weight, gen)

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def inputs(self, adapted: torch.Tensor) -> torch.Tensor:
        return F.normalize(adapted, dim=-1) if self.normalize_input else adapted

    @torch.no_grad()
    def init_pca(self, adapted: torch.Tensor) -> None:
        """Rows = the top ``d`` principal directions of ``inputs(adapted)`` ``(n, H)``, bias centres
        them: the head starts as the trunk's own most varied ``d``-dim view of the objective's data."""
        x = self.inputs(adapted).float()
        d = self.linear.out_features
        if len(x) < d:
            raise ValueError(f"head init 'pca' needs at least dim = {d} training texts, got {len(x)}")
        mu = x.mean(0)
        vt = torch.linalg.svd(x - mu, full_matrices=False).Vh[:d]
        self.linear.weight.copy_(vt)
        self.linear.bias.copy_(-(vt @ mu))

    def forward(self, adapted: torch.Tensor, lexical: torch.Tensor | None) -> torch.Tensor:
        return self.linear(self.inputs(adapted))


class LexicalHead(nn.Module):
    """``(n, F) hashed n-gram counts -> (n, F)`` scaled by ``exp(log_weight)`` per bucket;
    :meth:`init_idf` sets the weights to the corpus IDF (until then they are 1)."""

    def __init__(self, featurizer: HashedNgrams) -> None:
        super().__init__()
        self.featurizer = featurizer
        self.log_weight = nn.Parameter(torch.zeros(featurizer.n_features))

    @property
    def out_features(self) -> int:
        return self.featurizer.n_features

    @torch.no_grad()
    def init_idf(self, idf: np.ndarray) -> None:
        self.log_weight.copy_(torch.log(torch.from_numpy(np.asarray(idf, dtype=np.float32))))

    def forward(self, adapted: torch.Tensor, lexical: torch.Tensor | None) -> torch.Tensor:
        if lexical is None:
            raise ValueError("a lexical head needs lexical features")
        return lexical * torch.exp(self.log_weight)


HEAD_KINDS = ("linear", "lexical")
HEAD_INITS = ("orthogonal", "identity", "pca")
_MEMO_MIN = 1000  # texts: smaller lists are featurised directly


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
        head_specs: dict[str, HeadSpec] | None = None,
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
        specs = {n: (head_specs or {}).get(n, HeadSpec()) for n in objective_dims}
        self.head_specs = specs
        lexical = [n for n, sp in specs.items() if sp.kind == "lexical"]
        if len(lexical) > 1:
            raise ValueError(f"at most one lexical head, got {lexical}")
        self.lexical: HashedNgrams | None = None
        if lexical:
            sp = specs[lexical[0]]
            self.lexical = HashedNgrams(objective_dims[lexical[0]], sp.ngram_max, sp.stop_words)
        heads: dict[str, nn.Module] = {}
        for n, d in objective_dims.items():
            lex = specs[n].kind == "lexical"
            heads[n] = (LexicalHead(self.lexical) if lex and self.lexical
                        else LinearHead(h, d, specs[n].init, gen, specs[n].normalize_input))
        for n, head in heads.items():
            head.requires_grad_(specs[n].trainable)
        self.heads = nn.ModuleDict(heads)
        if architecture == "esp":
            self.layout = SubspaceLayout.from_dims(dict(objective_dims), losses=losses,
                                                   default_weights=default_weights)
        else:
            self.layout = SubspaceLayout.from_dims({SINGLE_HEAD: sum(objective_dims.values())},
                                                   losses={SINGLE_HEAD: "multi_task"})
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
            params += list(self.heads.parameters())
        return params

    def task_parameters(self, objective: str) -> list[nn.Parameter]:
        """Parameters only ``objective``'s loss depends on (never projected)."""
        params: list[nn.Parameter] = []
        if self.architecture == "esp":
            params += list(self.heads[objective].parameters())
        if objective == self.intent_objective and self.prototypes is not None:
            params.append(self.prototypes)
        return params

    # --- features -----------------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        """Width of a text's features: pooled trunk ``H``, then lexical counts ``F`` if any."""
        return self.trunk.hidden_size + (self.lexical.n_features if self.lexical else 0)

    def lexical_counts(self, texts: Sequence[str]) -> np.ndarray | None:
        """Hashed n-gram counts ``(n, F)`` (memoised for long lists: every run of an ablation
        featurises the same corpus), or ``None`` without a lexical head."""
        if self.lexical is None:
            return None
        return self.lexical.counts_memo(texts) if len(texts) >= _MEMO_MIN else self.lexical.counts(texts)

    def with_lexical(self, texts: Sequence[str], pooled: np.ndarray) -> np.ndarray:
        """Pooled trunk features ``(n, H)`` -> text features ``(n, feature_dim)``."""
        counts = self.lexical_counts(texts)
        return pooled if counts is None else np.concatenate([pooled, counts], axis=1)

    def init_lexical_idf(self, corpus_texts: Sequence[str]) -> None:
        """Set every lexical head's weights to the IDF of ``corpus_texts`` (what it will rank)."""
        from esp_retrieval.subspace.lexical import idf

        counts = self.lexical_counts(corpus_texts)
        for head in self.heads.values():
            if isinstance(head, LexicalHead) and counts is not None and len(counts):
                head.init_idf(idf(counts))

    @torch.no_grad()
    def init_pca(self, objective: str, features: torch.Tensor, labels: Sequence[int] | None = None) -> None:
        """Start ``objective``'s linear head at the principal directions of its training texts'
        features ``(n, feature_dim)`` (:meth:`LinearHead.init_pca`); with ``labels`` and the intent
        objective, start the prototypes at the normalised class means of the vectors its loss
        reads, so the untrained classifier is a nearest-centroid one (a class without rows keeps
        its random prototype)."""
        head = self.heads[objective]
        if not isinstance(head, LinearHead):
            kind = self.head_specs[objective].kind
            raise ValueError(f"head init 'pca' needs a linear head; {objective!r} is {kind}")
        x = features[:, : self.trunk.hidden_size]
        head.init_pca(self.adapter(x) if self.adapter is not None else x)
        if labels is None or objective != self.intent_objective or self.prototypes is None:
            return
        z = self.objective_vector(features, objective)
        y = torch.as_tensor(list(labels), device=z.device)
        for c in range(self.prototypes.shape[0]):
            if bool((y == c).any()):
                self.prototypes[c] = F.normalize(z[y == c].mean(0), dim=-1)

    def pooled(self, texts: Sequence[str]) -> torch.Tensor:
        x = self.trunk(texts)
        counts = self.lexical_counts(texts)
        return x if counts is None else torch.cat([x, torch.from_numpy(counts).to(x.device, x.dtype)], -1)

    def _head_outputs(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk.hidden_size
        x = features[:, :h]
        x = self.adapter(x) if self.adapter is not None else x
        lex = features[:, h:] if self.lexical is not None else None
        return {name: F.normalize(head(x, lex), dim=-1) for name, head in self.heads.items()}

    def blocks(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-block L2-normalised outputs ``{block: (n, d_k)}`` from text features."""
        out = self._head_outputs(pooled)
        if self.architecture == "esp":
            return out
        return {SINGLE_HEAD: F.normalize(torch.cat([out[n] for n in self.objective_names], -1), dim=-1)}

    def objective_vector(self, pooled: torch.Tensor, objective: str) -> torch.Tensor:
        """The normalised vector objective ``objective``'s loss reads, ``(n, d)``."""
        if self.architecture == "esp":
            x = pooled[:, : self.trunk.hidden_size]
            x = self.adapter(x) if self.adapter is not None else x
            lex = pooled[:, self.trunk.hidden_size :] if self.lexical is not None else None
            return F.normalize(self.heads[objective](x, lex), dim=-1)
        return self.blocks(pooled)[SINGLE_HEAD]

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

    def text_features(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """``(n, feature_dim)`` float32: pooled trunk features, then lexical counts if any."""
        texts = list(texts)
        return self.with_lexical(texts, self.trunk.encode(texts, batch_size=batch_size))

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embed arbitrary texts: ``(n, D)`` float32, every block L2-normalised."""
        return self.encode_pooled(self.text_features(texts, batch_size=batch_size))

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
        return self.intent_probs_pooled(self.text_features(texts))

    @property
    def device(self) -> torch.device:
        return next(self.heads.parameters()).device

    # --- serialisation ------------------------------------------------------------------
    def encoder_config(self) -> dict[str, Any]:
        """The JSON the service's ``QueryEncoder`` reads (see ``esp_retrieval/encoder/query_encoder.py``)."""
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
            "heads": [
                {"name": n, "kind": self.head_specs[n].kind, "in": h, "out": head.out_features,
                 "normalize_input": self.head_specs[n].normalize_input}
                for n, head in self.heads.items()
            ],
            "lexical": self.lexical.to_dict() if self.lexical is not None else None,
            "layout": self.layout.to_dict(),
            "intent": intent,
            "normalize": "per_block" if self.architecture == "esp" else "per_head_then_concat",
        }

    def head_tensors(self) -> dict[str, torch.Tensor]:
        t: dict[str, torch.Tensor] = {}
        if self.adapter is not None:
            t.update({f"adapter.{k}": v for k, v in self.adapter.state_dict().items()})
        for name, head in self.heads.items():
            if isinstance(head, LexicalHead):  # the effective per-bucket weights, no bias
                t[f"heads.{name}.weight"] = torch.exp(head.log_weight.detach())
            else:
                assert isinstance(head, LinearHead)
                t.update({f"heads.{name}.{k}": v for k, v in head.linear.state_dict().items()})
        if self.prototypes is not None:
            t["intent.prototypes"] = self.prototypes.detach()
        return {k: v.detach().float().cpu().contiguous() for k, v in t.items()}

    def save_encoder(self, out_dir: str | Path) -> Path:
        """Write the query encoder folder: transformer/ + esp_encoder.json + heads.safetensors,
        readable by every uid (files 0o644, folders 0o755)."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model: Any = self.trunk.model
        model.save_pretrained(str(out / encoder_format.TRANSFORMER_DIR), safe_serialization=True)
        self.trunk.tokenizer.save_pretrained(str(out / encoder_format.TRANSFORMER_DIR))
        save_file(self.head_tensors(), str(out / encoder_format.HEADS_FILE))
        config = json.dumps(self.encoder_config(), indent=2)
        (out / encoder_format.CONFIG_FILE).write_text(config, encoding="utf-8")
        return make_readable(out)  # safetensors writes 0o600: a non-root server could not read it


def _orthogonal_(weight: torch.Tensor, gen: torch.Generator) -> None:
    """Seeded (semi-)orthogonal init: an untrained head is a random isometry-like projection."""
    rows, cols = weight.shape
    a = torch.randn(max(rows, cols), min(rows, cols), generator=gen)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    with torch.no_grad():
        weight.copy_(q if rows >= cols else q.T)
