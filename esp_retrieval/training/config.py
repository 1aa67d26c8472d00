"""Training configuration: pydantic-settings from a YAML file, overridable by environment variables.

Precedence: explicit keyword arguments > ``ESP_TRAIN_*`` environment variables (nested fields
with ``__``, e.g. ``ESP_TRAIN_OPTIM__STEPS=50``, ``ESP_TRAIN_TRUNK__MODE=top:2``) > the YAML file
> defaults. Methods are named by registry key and their parameters passed as kwargs
(``loss`` / ``loss_params``, ``weighting.name`` / ``weighting.params``, ...). Unknown keys are
errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_YAML_PATH: contextvars.ContextVar[Path | None] = contextvars.ContextVar("esp_train_yaml", default=None)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HeadConfig(_Strict):
    kind: Literal["linear", "lexical"] = Field(
        default="linear", description="linear: reads the adapter; lexical: hashed word n-grams, dim = buckets"
    )
    init: Literal["orthogonal", "identity", "pca"] = Field(
        default="orthogonal",
        description="linear heads: identity (dim = trunk width) starts at the trunk; pca at the top-dim "
        "principal directions of the objective's training texts (intent: prototypes at the class means)",
    )
    ngram_max: int = Field(default=2, ge=1, le=3, description="lexical heads: word n-grams 1..ngram_max")
    stop_words: Literal["english"] | None = Field(default="english", description="lexical heads")
    trainable: bool = Field(default=True, description="false: the head keeps its initialisation")
    normalize_input: bool = Field(
        default=False,
        description="linear heads: read the L2-normalised pooled vector (the trunk's sentence embedding)",
    )


class ObjectiveConfig(_Strict):
    name: str = Field(description="subspace name (lower-case, digits, underscores)")
    dim: int = Field(gt=0, description="dimensions of this objective's block")
    data: str = Field(description="objective data builder: semantic | entity | intent")
    data_params: dict[str, Any] = Field(default_factory=dict)
    loss: str = Field(description="loss registry key: info_nce | cross_entropy | mse | bce")
    loss_params: dict[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(default=64, ge=2)
    default_weight: float = Field(default=1.0, ge=0)
    head: HeadConfig = Field(default_factory=HeadConfig)


class TermWeightsSpec(_Strict):
    """Learned term weights on the sparse block (:mod:`esp_retrieval.training.term_weights`): a
    per-term multiplier ``exp(theta . phi(t))`` over the features named, ``theta`` fitted on the
    training queries only and folded into the block's document side."""

    features: list[str] | None = Field(
        default=None,
        description="term features (esp_retrieval.training.term_weights.FEATURES keys; null: all)")
    candidates: int = Field(default=100, ge=2, description="BM25 top-k per training query the loss ranks")
    temperature: float = Field(default=0.05, gt=0, description="of the listwise softmax over block scores")
    entity_weight: float = Field(
        default=0.0, ge=0,
        description="the entity-link loss' weight (relevance: 1); 0, the best of 0 / 0.25 / 1 in a "
        "validation inside the training years (bench/term_weights_cv.py)")
    steps: int = Field(default=200, ge=0)
    lr: float = Field(default=0.05, gt=0)
    l2: float = Field(default=0.01, ge=0, description="on theta: pulls the weights towards BM25's (theta 0)")


class SparseBlockSpec(_Strict):
    """A sparse BM25 block (:mod:`subspace.sparse`, built by :func:`training.sparse_lexical.build_bm25`)
    scored exactly beside the dense blocks: in a bundle (``esp train``: ``sparse/<name>/``) or in
    the evaluation (a method's ``sparse:``)."""

    name: str = Field(default="bm25", pattern=r"^[a-z][a-z0-9_]{0,62}$")
    k1: float = Field(default=0.9, gt=0)
    b: float = Field(default=0.4, ge=0, le=1)
    stopwords: str | None = "en"
    default_weight: float = Field(default=1.0, ge=0, description="its weight at the default serving weights")
    term_weights: TermWeightsSpec | None = Field(
        default=None, description="learned term weights on top of BM25 (null: BM25's own)")


class TrunkConfig(_Strict):
    path: str | None = Field(default=None, description="HF model folder; null = all-MiniLM-L6-v2 package")
    mode: str = Field(
        default="frozen",
        description="frozen | top:N | full | query_top:N (the top N layers train for queries only; "
        "passages keep the frozen features, esp_retrieval.training.query_tower)")
    max_length: int | None = Field(
        default=None, ge=8,
        description="tokens per text; null = the trunk's own max_seq_length (its sentence-transformers "
        "config: 256 for all-MiniLM-L6-v2), what sentence-transformers and MTEB run")
    encode_batch_size: int = Field(default=64, ge=1)
    features_cache: str | None = Field(
        default="artifacts/cache/features",
        description="frozen and query_top modes: folder for cached trunk features"
    )
    features_shipped: bool = Field(
        default=True,
        description="frozen mode: first read the precomputed features shipped in <data_dir>/trunk-features "
        "(used only where the trunk and the texts match them; never written)",
    )

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        from esp_retrieval.training.model import TrunkMode

        return str(TrunkMode.parse(v))


class MethodConfig(_Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class OptimConfig(_Strict):
    steps: int = Field(default=300, ge=0)
    lr: float = Field(default=1e-3, gt=0)
    trunk_lr: float = Field(default=2e-5, gt=0, description="learning rate of trainable trunk layers")
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_steps: int = Field(default=20, ge=0)
    grad_clip: float | None = Field(default=1.0, gt=0)


class SplitConfig(_Strict):
    by: Literal["year", "fold"] = Field(
        default="year", description="year: hold out one TREC DL year; fold: hold out DL-Hard folds"
    )
    heldout_year: Literal["dl19", "dl20"] = "dl20"
    heldout_folds: list[int] = Field(default_factory=lambda: [5])
    intent_heldout_fraction: float = Field(default=0.2, gt=0, lt=1)
    intent_folds: int | None = Field(
        default=None, ge=2, description="k of a stratified k-fold split of ORCAS-I (null: hash fraction)"
    )
    intent_fold: int = Field(default=0, ge=0, description="ORCAS-I fold held out when intent_folds is set")

    @model_validator(mode="after")
    def _fold_in_range(self) -> SplitConfig:
        if self.intent_folds is not None and self.intent_fold >= self.intent_folds:
            raise ValueError(f"intent_fold must be in [0, {self.intent_folds - 1}], got {self.intent_fold}")
        return self


class EvalConfig(_Strict):
    enabled: bool = Field(default=True, description="held-out metrics at start and end (false: the caller's)")
    every: int = Field(
        default=100, ge=0, description="evaluate held-out metrics every N steps (0: start+end)"
    )
    max_corpus: int | None = Field(
        default=None,
        description="non-frozen modes: cap the eval corpus (judged/mentioned passages first); null = all",
    )


class ExportConfig(_Strict):
    enabled: bool = True
    corpus: str = Field(default="trec", description="'trec' (the TREC DL passage pool) or a TSV/JSONL file")
    dtype: Literal["float32", "float16"] = "float32"


class TrainConfig(BaseSettings):
    """Everything one training run needs; see ``configs/demo.yaml`` for a commented example."""

    model_config = SettingsConfigDict(env_prefix="ESP_TRAIN_", env_nested_delimiter="__", extra="forbid")

    seed: int = 0
    data_dir: str | None = Field(
        default=None, description="shipped data folder; null = the repository's data/"
    )
    architecture: Literal["esp", "single_head"] = "esp"
    trunk: TrunkConfig = Field(default_factory=TrunkConfig)
    adapter_hidden: int | None = Field(default=256, description="shared residual adapter width; null = none")
    cosine_scale: float = Field(default=16.0, gt=0, description="intent cosine-classifier scale")
    objectives: list[ObjectiveConfig]
    weighting: MethodConfig = Field(default_factory=lambda: MethodConfig(name="dwa"))
    surgery: MethodConfig = Field(default_factory=lambda: MethodConfig(name="pcgrad"))
    optim: OptimConfig = Field(default_factory=OptimConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    sparse: SparseBlockSpec | None = Field(
        default=None, description="a sparse BM25 block over the exported corpus, written into the bundle")
    device: str = "cpu"
    threads: int | None = Field(default=None, description="torch threads; null = torch's default")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        names = [o.name for o in self.objectives]
        if self.sparse is not None and self.sparse.name in names:
            raise ValueError(
                f"sparse.name {self.sparse.name!r} is an objective's name; a weight names one block")
        if not names:
            raise ValueError("objectives: at least one objective is required")
        if self.export.enabled and self.trunk.mode.startswith("query_top"):
            raise ValueError(
                f"trunk.mode {self.trunk.mode!r} trains a query-only tower, so a bundle's one encoder could "
                "not embed documents as the corpus was (esp index, live upserts); set export.enabled false "
                "(evaluation) or use 'frozen', 'top:N' or 'full'")
        if len(set(names)) != len(names):
            raise ValueError(f"objectives: duplicate names in {names}")
        from esp_retrieval.training.data.objectives import BUILDERS
        from esp_retrieval.training.losses import LOSSES
        from esp_retrieval.training.surgery import SURGERIES
        from esp_retrieval.training.weighting import WEIGHTINGS

        for o in self.objectives:
            if o.data not in BUILDERS:
                raise ValueError(
                    f"objectives[{o.name}].data {o.data!r} is invalid; allowed: {sorted(BUILDERS)}"
                )
            if o.loss not in LOSSES:
                raise ValueError(
                    f"objectives[{o.name}].loss {o.loss!r} is invalid; allowed: {sorted(LOSSES)}"
                )
        if self.weighting.name not in WEIGHTINGS:
            raise ValueError(
                f"weighting.name {self.weighting.name!r} is invalid; allowed: {sorted(WEIGHTINGS)}"
            )
        if self.surgery.name not in SURGERIES:
            raise ValueError(f"surgery.name {self.surgery.name!r} is invalid; allowed: {sorted(SURGERIES)}")
        if sum(1 for o in self.objectives if o.data == "intent") > 1:
            raise ValueError("objectives: at most one intent objective (it owns the cosine classifier)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        from pydantic_settings import YamlConfigSettingsSource

        path = _YAML_PATH.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def read_yaml_mapping(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A YAML file that must hold a mapping; errors name the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{p}: must be a YAML mapping of config fields")
    return data


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Read ``path`` (YAML), apply ``ESP_TRAIN_*`` env overrides, then ``overrides``."""
    if path is not None:
        p = Path(path)
        read_yaml_mapping(p)  # fail early with a clear message; the settings source reads it
        token = _YAML_PATH.set(p)
        try:
            return TrainConfig(**overrides)
        finally:
            _YAML_PATH.reset(token)
    return TrainConfig(**overrides)
