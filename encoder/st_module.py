"""The bundle's query encoder as one sentence-transformers module (``esp export-st`` writes it).

A sentence-transformers folder is a ``modules.json`` pipeline. The ESP encoder's output is the
concatenation of per-block L2-normalised heads (some heads may read more than the pooled
trunk output), and a per-block normalisation is no built-in module, so the whole encoder is
one custom *input* module, :class:`ESPQueryEncoderModule`: its ``preprocess`` keeps the texts,
its ``forward`` runs :class:`encoder.query_encoder.QueryEncoder` on them. The folder is the
bundle's ``encoder/`` folder unchanged (``esp_encoder.json``, ``heads.safetensors``,
``transformer/``) plus ``modules.json`` and ``config_sentence_transformers.json``, so
``SentenceTransformer(path, trust_remote_code=True).encode(texts)`` returns
``QueryEncoder.load(path).encode(texts)``: ``(n, D)``, every block unit-norm, layout order.

sentence-transformers 6 imports a module class outside its own namespace only with
``trust_remote_code=True``, for a local folder too; the code it then runs is this module of
the installed project (the type is ``encoder.st_module.ESPQueryEncoderModule``), nothing is
fetched and nothing in the folder is executed. Built-in modules alone cannot express the
encoder: the residual adapter and the per-block normalisation have no built-in module
(``Normalize`` normalises the whole vector), so a pipeline of them would give other vectors.

What follows: ``normalize_embeddings=True`` would normalise the whole vector (do not use it:
the blocks already are), the similarity is the dot product (the sum of block cosines; weight
the blocks as ``POST /v1/embeddings`` does), and the module is for inference: fine-tuning goes
through ``esp train``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules.input_module import InputModule

from encoder.query_encoder import QueryEncoder
from subspace.atomic import make_readable

#: modules.json type of the module; the folder needs this package to load
MODULE_TYPE = "encoder.st_module.ESPQueryEncoderModule"
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
