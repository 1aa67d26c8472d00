"""The bundle's query encoder as one sentence-transformers module (``esp export-st`` writes it).

A sentence-transformers folder is a ``modules.json`` pipeline. The ESP encoder's output is the
concatenation of per-block L2-normalised heads (some heads may read more than the pooled
trunk output), and a per-block normalisation is no built-in module, so the whole encoder is
one custom *input* module, :class:`ESPQueryEncoderModule`: its ``preprocess`` keeps the texts,
its ``forward`` runs :class:`esp_retrieval.encoder.query_encoder.QueryEncoder` on them. The folder is the
bundle's ``encoder/`` folder unchanged (``esp_encoder.json``, ``heads.safetensors``,
``transformer/``) plus ``modules.json`` and ``config_sentence_transformers.json``, so
``SentenceTransformer(path, trust_remote_code=True).encode(texts)`` returns
``QueryEncoder.load(path).encode(texts)``: ``(n, D)``, every block unit-norm, layout order.

The folder carries its code: :func:`vendored_sources` copies this module and the project modules
it needs (the query encoder, the layout, the lexical featuriser, ...) into the folder as
``esp_*.py`` with their imports made relative, and ``modules.json`` names
``esp_st_module.ESPQueryEncoderModule``. sentence-transformers 6 loads such a repository-local
module with ``trust_remote_code=True`` (transformers' dynamic modules: the files are copied into
``HF_MODULES_CACHE`` and imported from there), so the folder loads with sentence-transformers and
its own dependencies alone, without this project installed; the code run is the folder's
``esp_*.py``, nothing is fetched. Built-in modules alone cannot express the encoder: the residual
adapter and the per-block normalisation have no built-in module (``Normalize`` normalises the
whole vector), so a pipeline of them would give other vectors.

What follows: ``normalize_embeddings=True`` would normalise the whole vector (do not use it:
the blocks already are), the similarity is the dot product (the sum of block cosines; weight
the blocks as ``POST /v1/embeddings`` does), and the module is for inference: fine-tuning goes
through ``esp train``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules.input_module import InputModule

from esp_retrieval.encoder.query_encoder import QueryEncoder
from esp_retrieval.subspace.atomic import make_readable

#: The project modules an export carries -> their file names in it (without ``.py``): what this
#: module imports of the project, transitively. Their imports of each other become relative.
VENDORED = {
    "esp_retrieval.subspace.errors": "esp_errors",
    "esp_retrieval.subspace.jsonfile": "esp_jsonfile",
    "esp_retrieval.subspace.layout": "esp_layout",
    "esp_retrieval.subspace.lexical": "esp_lexical",
    "esp_retrieval.subspace.encoder_format": "esp_encoder_format",
    "esp_retrieval.subspace.atomic": "esp_atomic",
    "esp_retrieval.encoder.query_encoder": "esp_query_encoder",
    "esp_retrieval.encoder.st_module": "esp_st_module",
}
#: modules.json type of the module: the folder's own copy of this module
MODULE_TYPE = f"{VENDORED['esp_retrieval.encoder.st_module']}.ESPQueryEncoderModule"
_OURS = re.compile(r"^(\s*)from (esp_retrieval\.(?:subspace|encoder)\.\w+) import ", re.M)
_ANY_OURS = re.compile(r"^\s*(?:from|import) esp_retrieval\b", re.M)
TEXTS_KEY = "esp_texts"


class ESPQueryEncoderModule(InputModule):
    """Texts -> ``sentence_embedding (n, D)``: the ESP query encoder inside a SentenceTransformer."""

    config_keys: list[str] = []  # noqa: RUF012 - the base class's declaration

    def __init__(self, encoder_dir: str | Path, device: str = "cpu") -> None:
        super().__init__()
        self.encoder_dir = Path(encoder_dir)
        self.encoder = QueryEncoder.load(self.encoder_dir, device=device)
        self.tokenizer = self.encoder.tokenizer
        # a registered submodule, so SentenceTransformer.to(device) and .eval() reach the trunk
        self.trunk = self.encoder.model

    @property
    def max_seq_length(self) -> int:
        return self.encoder.max_length

    def get_embedding_dimension(self) -> int:
        return self.encoder.dim

    def get_sentence_embedding_dimension(self) -> int:
        return self.encoder.dim

    def preprocess(
        self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor | Any]:
        texts = [str(t) for t in inputs]
        if prompt:
            texts = [prompt + t for t in texts]
        return {TEXTS_KEY: texts}

    def forward(
        self, features: dict[str, torch.Tensor | Any], **kwargs: Any
    ) -> dict[str, torch.Tensor | Any]:
        texts = [str(t) for t in features[TEXTS_KEY]]
        vectors = self.encoder.encode(texts)
        features["sentence_embedding"] = torch.from_numpy(vectors)
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        out = Path(output_path)
        if out.resolve() != self.encoder_dir.resolve():
            copy_encoder_folder(self.encoder_dir, out)

    @classmethod
    def load(  # type: ignore[override]
        cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any
    ) -> ESPQueryEncoderModule:
        path = Path(model_name_or_path) / subfolder
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: an exported ESP encoder folder is a local directory")
        return cls(path)


def copy_encoder_folder(src: Path, out: Path) -> None:
    """The encoder files of ``src`` (an ``encoder/`` folder) into ``out``, readable by every uid
    (copies keep the source's modes, and an older bundle may hold 0o600 safetensors)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        target = out / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)
    make_readable(out)


def vendored_sources() -> dict[str, str]:
    """File name -> source of the modules an export carries (:data:`VENDORED`), each import of
    another project module rewritten to the relative import of its copy. Raises ``RuntimeError``
    if a copy would still import the project (a module added to the chain but not to the table)."""
    def relative(m: re.Match[str]) -> str:
        if m.group(2) not in VENDORED:
            raise RuntimeError(f"{m.group(2)} is imported by a copied module but not in st_module.VENDORED")
        return f"{m.group(1)}from .{VENDORED[m.group(2)]} import "

    out = {}
    for dotted, name in VENDORED.items():
        spec = importlib.util.find_spec(dotted)
        origin = spec.origin if spec is not None else None
        if origin is None:
            raise RuntimeError(f"{dotted}: no source file to copy")
        text = _OURS.sub(relative, Path(origin).read_text(encoding="utf-8"))
        if _ANY_OURS.search(text):
            raise RuntimeError(f"{dotted}: an import of the project is left in its copy")
        out[f"{name}.py"] = text
    return out


def sentence_transformers_files(similarity: str = "dot") -> dict[str, str]:
    """``modules.json`` and ``config_sentence_transformers.json`` of an exported folder."""
    import sentence_transformers
    import transformers

    modules = [{"idx": 0, "name": "0", "path": "", "type": MODULE_TYPE}]
    config = {
        "model_type": "SentenceTransformer",
        "__version__": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "pytorch": torch.__version__,
        },
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": similarity,
    }
    return {
        "modules.json": json.dumps(modules, indent=2) + "\n",
        "config_sentence_transformers.json": json.dumps(config, indent=2) + "\n",
    }
