"""The query tower of trunk mode ``query_top:N``: the top N trunk layers train on queries only.

An asymmetric bi-encoder (docs/architecture.md, "Training"): passages keep the frozen trunk's
pooled features (the cached or shipped ones, exactly what ``frozen`` mode reads), so scoring the
passage pool needs no new corpus pass; queries run the trunk's own top N layers, which train.
The layers below them never change, so a query's hidden states at their input are computed once
(:class:`QueryTower`, memoised per process by the untrained trunk's fingerprint) and a step runs
only N layers over them. The trained layers are shared by every objective whose loss reads a
query through the trunk (semantic and intent; a lexical head does not read the trunk), so
gradient surgery and task weighting act on them.

:class:`TowerStore` is what the trainer calls for text features: a text of the passage side
(the corpus, and the positives and negatives of pair objectives) reads the frozen
:class:`esp_retrieval.training.features.FeatureStore`; every other text is a query and goes through the tower.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from esp_retrieval.training.features import FeatureStore, all_cores
from esp_retrieval.training.model import ESPModel, Trunk, mean_pool

#: (untrained trunk fingerprint, split layer) -> text -> hidden states ``(tokens, H)`` below the tower
_MEMO: dict[tuple[str, int], dict[str, torch.Tensor]] = {}


class QueryTower:
    """The trunk's top ``trunk.mode.top`` layers over cached hidden states of the layers below.

    ``fingerprint`` (of the untrained trunk) keys a per-process memo of those hidden states, so
    the runs of an ablation compute them once; ``None`` keeps them to this tower.
    """

    def __init__(self, trunk: Trunk, *, fingerprint: str | None = None, batch_size: int = 64) -> None:
        if not trunk.mode.query_only:
            raise ValueError(f"a query tower needs trunk mode query_top:N, got {trunk.mode}")
        self.trunk = trunk
        layers = trunk.layers()
        self.split = len(layers) - trunk.mode.top
        self.batch_size = int(batch_size)
        #: the untrained copy of the tower's layers: the frozen trunk, for :meth:`encode` ``(trained=False)``
        self.initial = copy.deepcopy(layers[self.split :]).requires_grad_(False).eval()
        self._states: dict[str, torch.Tensor] = (
            _MEMO.setdefault((fingerprint, self.split), {}) if fingerprint is not None else {}
        )

    @property
    def layers(self) -> nn.ModuleList:
        """The trained layers (the trunk's own modules: what the optimiser and the bundle see)."""
        return self.trunk.layers()[self.split :]

    @torch.inference_mode()
    def prepare(self, texts: Iterable[str]) -> None:
        """Compute and keep the hidden states below the tower of the texts not seen yet."""
        todo = sorted({t for t in texts if t not in self._states}, key=len)
        if not todo:
            return
        model = self.trunk.model
        was = model.training
        model.eval()
        device = next(model.parameters()).device
        # a forward pass over every query: GEMM-bound, scales with the cores
        with all_cores():
            try:
                for start in range(0, len(todo), self.batch_size):
                    chunk = todo[start : start + self.batch_size]
                    batch = {k: v.to(device) for k, v in self.trunk.tokenize(chunk).items()}
                    out = model(**batch, output_hidden_states=True)
                    hidden = out.hidden_states[self.split]
                    lengths = batch["attention_mask"].sum(1).tolist()
                    for i, t in enumerate(chunk):
                        self._states[t] = hidden[i, : int(lengths[i])].detach().clone()
            finally:
                model.train(was)

    def forward(self, texts: Sequence[str], *, trained: bool = True) -> torch.Tensor:
        """Pooled query features ``(n, H)``; with gradients through the trained layers (when enabled)."""
        from transformers.masking_utils import create_bidirectional_mask

        self.prepare(texts)
        states = [self._states[t] for t in texts]
        hidden = nn.utils.rnn.pad_sequence(states, batch_first=True)
        mask = torch.zeros(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        for i, s in enumerate(states):
            mask[i, : s.shape[0]] = 1
        model = self.trunk.model
        attn = create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask)
        for layer in self.layers if trained else self.initial:
            hidden = layer(hidden, attn)
        return mean_pool(hidden, mask)

    __call__ = forward

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], *, trained: bool = True, batch_size: int = 256) -> np.ndarray:
        """Pooled query features ``(n, H)`` float32 in evaluation mode (no dropout)."""
        texts = list(texts)
        self.prepare(texts)
        model = self.trunk.model
        was = model.training
        model.eval()
        out = np.zeros((len(texts), self.trunk.hidden_size), dtype=np.float32)
        try:
            for start in range(0, len(texts), batch_size):
                chunk = texts[start : start + batch_size]
                out[start : start + len(chunk)] = self.forward(chunk, trained=trained).float().cpu().numpy()
        finally:
            model.train(was)
        return out


class TowerStore:
    """Text features for trunk mode ``query_top:N``: passages from the frozen store, queries
    through the tower (``(n, feature_dim)``: pooled features, then lexical counts if any).

    ``passages``: the texts of the passage side; every other text is a query. ``frozen`` holds the
    frozen trunk's features of every text the run embeds (passages and queries alike).
    """

    def __init__(
        self, model: ESPModel, frozen: FeatureStore, tower: QueryTower, passages: Iterable[str]
    ) -> None:
        self.model, self.frozen, self.tower = model, frozen, tower
        self.passages = frozenset(passages)
        self.hidden = model.trunk.hidden_size

    @property
    def row(self) -> dict[str, int]:
        """The frozen store's rows (the texts it holds)."""
        return self.frozen.row

    def is_query(self, text: str) -> bool:
        return text not in self.passages

    def query_features(self, texts: Sequence[str], *, trained: bool = True) -> torch.Tensor:
        """Tower features of query texts, lexical counts appended (read from the frozen store
        when it holds the texts)."""
        texts = list(texts)
        pooled = self.tower(texts, trained=trained)
        if self.model.lexical is None:
            return pooled
        if all(t in self.frozen.row for t in texts):
            lex = self.frozen(texts)[:, self.hidden :]
        else:
            counts = self.model.lexical_counts(texts)
            assert counts is not None
            lex = torch.from_numpy(counts)
        return torch.cat([pooled, lex.to(pooled.device, pooled.dtype)], -1)

    def query_features_np(
        self, texts: Sequence[str], *, trained: bool = True, batch_size: int = 256
    ) -> np.ndarray:
        """:meth:`query_features` of many texts in evaluation mode, ``(n, feature_dim)`` float32."""
        texts = list(texts)
        pooled = self.tower.encode(texts, trained=trained, batch_size=batch_size)
        return self.model.with_lexical(texts, pooled).astype(np.float32, copy=False)

    def features_np(self, texts: Sequence[str]) -> np.ndarray:
        """Features of many texts in evaluation mode (no dropout, no gradients), ``(n, feature_dim)``."""
        texts = list(texts)
        out = self.frozen(texts).detach().cpu().numpy().astype(np.float32, copy=True)
        queries = [i for i, t in enumerate(texts) if self.is_query(t)]
        if queries:
            out[queries] = self.query_features_np([texts[i] for i in queries])
        return out

    def __call__(self, texts: list[str]) -> torch.Tensor:
        queries = [i for i, t in enumerate(texts) if self.is_query(t)]
        if not queries:
            return self.frozen(texts)
        if len(queries) == len(texts):
            return self.query_features(texts)
        q = self.query_features([texts[i] for i in queries])
        out = self.frozen(texts).to(q.dtype).clone()
        index = torch.tensor(queries, device=out.device)
        return out.index_copy(0, index, q)
