"""The evaluation config (``configs/eval.yaml``): seeds, held-out years, methods, clustering, quick mode.

Methods are overrides of one base training config (:class:`esp_retrieval.training.config.TrainConfig`
fields), deep-merged, so every method trains on the same data with the same budget and
differs only where its overrides say. Unknown keys are errors naming the allowed ones.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from esp_retrieval.training.config import SparseBlockSpec, read_yaml_mapping

Year = Literal["dl19", "dl20"]
_YEARS: tuple[Year, ...] = ("dl20", "dl19")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HybridSpec(_Strict):
    """An untrained BM25 + zero-shot-trunk hybrid (:mod:`esp_retrieval.training.evaluate.hybrid`)."""

    fusion: Literal["minmax", "rrf"] = "minmax"
    k1: float = Field(default=0.9, gt=0)
    b: float = Field(default=0.4, ge=0, le=1)
    stopwords: str | None = Field(default="en", description="bm25s stop-word list ('en') or null")
    depth: int | None = Field(default=None, ge=1,
                              description="fuse each retriever's top `depth` (null: the whole corpus)")
    alpha_step: float = Field(default=0.05, gt=0, le=1, description="minmax: the BM25 weight's sweep grid")
    rrf_k: float = Field(default=60.0, gt=0)


class MethodSpec(_Strict):
    label: str
    zero_shot: bool = False
    hybrid: HybridSpec | None = Field(
        default=None, description="an untrained BM25 + zero-shot hybrid (no training; the anchor row)")
    sparse: SparseBlockSpec | None = Field(
        default=None, description="a trained method scored with this sparse BM25 block beside its own blocks")
    overrides: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] | None = Field(
        default=None, description="train only these of the eval seeds (ablation rows); null = all")
    objectives: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-objective overrides by name, deep-merged into the base objectives (ablations)")

    @property
    def trained(self) -> bool:
        """False for the references that need no training: the zero-shot trunk and hybrids."""
        return not self.zero_shot and self.hybrid is None

    @model_validator(mode="after")
    def _one_kind(self) -> MethodSpec:
        if self.zero_shot and self.hybrid is not None:
            raise ValueError("a method is zero_shot or hybrid, not both")
        if self.sparse is not None and not self.trained:
            raise ValueError("sparse: only a trained method takes a sparse block")
        return self


class LeverSpec(_Strict):
    """A lever of the recipe: ``method`` has it, ``baseline`` is the same method without it
    (:mod:`esp_retrieval.training.evaluate.levers`)."""

    method: str
    baseline: str


class ClusterMethod(_Strict):
    method: str
    params: dict[str, Any] = Field(default_factory=dict)


class ClusteringConfig(_Strict):
    mimics_parents: int = Field(default=300, ge=2)
    weights: dict[str, dict[str, float]] = Field(default_factory=dict)
    methods: list[ClusterMethod] = Field(default_factory=list)


class DataSlice(_Strict):
    """A consistent copy of part of the shipped data (see :mod:`esp_retrieval.training.evaluate.slice`).

    ``null`` keeps everything of that kind; ``corpus: judged`` keeps only the judged passages of
    the kept queries (a condensed-list corpus), ``pool`` their pool candidates.
    """

    queries_per_year: int | None = Field(default=4, ge=1)
    pool_per_query: int | None = Field(default=30, ge=1)
    corpus: Literal["pool", "judged"] = "pool"
    orcas_per_class: int | None = Field(default=12, ge=2)
    mimics_parents: int | None = Field(default=12, ge=2)


class EvalConfig(_Strict):
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    heldout_years: list[Year] = Field(default_factory=lambda: list(_YEARS), min_length=1)
    intent_folds: int | None = Field(
        default=5, ge=2, description="stratified k-fold over ORCAS-I (null: the trainer's hash hold-out)")
    sweep_step: float = Field(default=0.1, gt=0, le=1)
    front_method: str
    hypervolume_ref: tuple[float, float] = (0.0, 0.0)
    training: dict[str, Any]
    methods: dict[str, MethodSpec]
    clustering: ClusteringConfig = Field(default_factory=ClusteringConfig)
    levers: dict[str, LeverSpec] = Field(
        default_factory=dict, description="lever label -> the methods with and without it (one row each)")
    data_slice: DataSlice | None = None
    tiny_trunk: bool = Field(default=False, description="quick mode: a tiny random BERT as the trunk")
    quick: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.front_method not in self.methods:
            raise ValueError(
                f"front_method {self.front_method!r} is not a method; allowed: {sorted(self.methods)}")
        if not self.methods[self.front_method].trained:
            raise ValueError(f"front_method {self.front_method!r} must be a trained method")
        for name in self.methods:
            self.training_config(name)  # every method's merged config must validate
        for name, lever in self.levers.items():
            missing = [m for m in (lever.method, lever.baseline) if m not in self.methods]
            if missing:
                raise ValueError(f"levers.{name}: {missing} are not methods; allowed: {sorted(self.methods)}")
        return self

    def schedule(self) -> list[tuple[str, int | None]]:
        """``(held-out year, intent fold)`` of every run of one method and seed.

        With k intent folds there are ``max(k, years)`` runs; run f holds out intent fold ``f mod k``
        and TREC DL year ``f mod years``, so every ORCAS-I query is predicted exactly once per seed
        and every TREC DL query is scored by the models that never trained on it. Without folds:
        one run per year, all with the trainer's hash hold-out.
        """
        years = self.heldout_years
        if self.intent_folds is None:
            return [(y, None) for y in years]
        n = max(self.intent_folds, len(years))
        return [(years[f % len(years)], f % self.intent_folds) for f in range(n)]

    def training_dict(self, method: str, *, seed: int | None = None, heldout_year: str | None = None,
                      intent_fold: int | None = None) -> dict[str, Any]:
        """The merged training config of ``method`` as a dict (before TrainConfig validation)."""
        if method not in self.methods:
            raise ValueError(f"method {method!r} is unknown; allowed: {sorted(self.methods)}")
        spec = self.methods[method]
        out = deep_merge(self.training, spec.overrides)
        if spec.objectives:
            names = [o.get("name") for o in out.get("objectives", [])]
            unknown = sorted(set(spec.objectives) - set(names))
            if unknown:
                raise ValueError(
                    f"methods.{method}.objectives: {unknown} are not objectives; allowed: {names}")
            out["objectives"] = [deep_merge(o, spec.objectives.get(o["name"], {})) for o in out["objectives"]]
        if seed is not None:
            out["seed"] = seed
            for part in ("surgery",):
                if out.get(part, {}).get("name") == "pcgrad":
                    out[part] = deep_merge(out[part], {"params": {"seed": seed}})
        if heldout_year is not None:
            out["split"] = deep_merge(out.get("split", {}), {"by": "year", "heldout_year": heldout_year})
        if intent_fold is not None:
            out["split"] = deep_merge(out.get("split", {}),
                                      {"intent_folds": self.intent_folds, "intent_fold": intent_fold})
        return out

    def training_config(self, method: str, **kw: Any) -> Any:
        from esp_retrieval.training.config import TrainConfig

        return TrainConfig(**self.training_dict(method, **kw))


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: mappings recursively, everything else (lists too) replaced."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_eval_config(path: str | Path, *, quick: bool = False) -> EvalConfig:
    """Read the YAML; with ``quick`` its ``quick:`` section is deep-merged over the rest and the
    tiny trunk is switched on."""
    p = Path(path)
    raw = read_yaml_mapping(p, "eval config")
    if quick:
        over = raw.get("quick") or {}
        raw = deep_merge(raw, over)
        raw.setdefault("data_slice", {})
        raw["tiny_trunk"] = True
    return EvalConfig(**raw)
