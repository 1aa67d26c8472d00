"""The query encoder that travels inside a bundle's ``encoder/`` folder.

Loadable with torch + transformers + safetensors only (never ``esp_retrieval/training/``): training writes
this folder, the service reads it. On-disk format (``format: esp-query-encoder``, versions 1-3)::

    encoder/
      esp_encoder.json     format, format_version, architecture ("esp" | "single_head"),
                           pooling ("mean"), max_length, hidden_size,
                           adapter: null | {kind: "residual_bottleneck", in, hidden, activation: "gelu"},
                           heads: [{name, kind ("linear" | "lexical"), in, out,
                                    normalize_input (v3: the head reads x / |x|)}] in layout order,
                           lexical: null | esp_retrieval.subspace.lexical.HashedNgrams spec (v2),
                           layout: the SubspaceLayout dict (must equal the bundle's),
                           intent: null | {objective, block, classes: [...], scale},
                           normalize: "per_block" | "per_head_then_concat" (single_head, v2)
      heads.safetensors    adapter.down.{weight,bias}, adapter.up.{weight,bias},
                           heads.<name>.{weight,bias} (linear) | heads.<name>.weight (F,) (lexical:
                           per-bucket weights), intent.prototypes (C, d_block)
      transformer/         the trunk: config.json + model.safetensors + tokenizer files

Maths (mirrors ``esp_retrieval/training/model.py``): tokens -> transformer -> mean pooling over the
attention mask ``(n, H)`` -> ``x + up(gelu(down(x)))`` when there is an adapter -> one linear
head per block, on ``x / |x|`` where the head says ``normalize_input`` (a lexical head instead
scales the text's hashed n-gram counts, computed by
:mod:`esp_retrieval.subspace.lexical` exactly as at training, by its per-bucket weights) -> each block
L2-normalised -> concatenated ``(n, D)`` (single_head: the heads' normalised outputs concatenated
and normalised again, one block). Intent probabilities
are ``softmax(scale * cos(z_block, prototype_c))`` over the intent classes. Encoding runs in
eval mode under ``torch.inference_mode()``, so it is deterministic.

Device: ``load(..., device="auto")`` encodes on CUDA when torch sees a device, on the CPU
otherwise (:func:`resolve_device`; the default stays ``"cpu"`` for offline callers, the service
asks for ``auto``). On CUDA the transformer runs under float16 autocast; pooling, the heads'
outputs and the block normalisation are float32, so a query differs from its CPU encoding only
by float16 rounding inside the trunk (the engine's re-rank is exact for whatever vector it gets).
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the PyTorch convention)

from esp_retrieval.subspace.encoder_format import (
    CONFIG_FILE,
    FORMAT,
    HEADS_FILE,
    READABLE_VERSIONS,
    TRANSFORMER_DIR,
)
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.jsonfile import parse_json_object
from esp_retrieval.subspace.layout import LayoutError, SubspaceLayout
from esp_retrieval.subspace.lexical import HashedNgrams

log = logging.getLogger(__name__)


class EncoderError(FieldError):
    """An encoder folder that cannot be loaded; the message names the file or field."""


#: the devices :meth:`QueryEncoder.load` accepts (``cuda:N`` picks one of several GPUs)
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(requested: str = "auto") -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cpu`` and ``cuda``
    (``cuda:N``) as asked. Asking for CUDA where there is none is an :class:`EncoderError`
    (field ``device``) rather than a silent CPU fallback."""
    name = requested.strip().lower()
    kind, _, index = name.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise EncoderError(
            f"encoder device {requested!r} is unknown; allowed: {list(DEVICES)} or cuda:N", "device"
        )
    available = torch.cuda.is_available()
    if kind == "auto":
        return "cuda" if available else "cpu"
    if kind == "cuda" and not available:
        raise EncoderError(f"encoder device {requested!r}: torch sees no CUDA device", "device")
    count = torch.cuda.device_count() if index else 0
    if index and int(index) >= count:
        raise EncoderError(f"encoder device {requested!r}: only {count} CUDA device(s)", "device")
    return name


class _Head(NamedTuple):
    """One block's head as read from the folder (``bias`` is ``None`` for a lexical head)."""

    name: str
    kind: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    normalize_input: bool


#: names of weight files: never given to transformers as files (safetensors are built from bytes)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")
_TRUNK_WEIGHTS = "model.safetensors"
_TRUNK_INDEX = "model.safetensors.index.json"


def read_folder(root: Path, digests: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """The files the encoder is built from (``esp_encoder.json``, ``heads.safetensors`` and all of
    ``transformer/``) as ``posix path in the folder -> bytes``, each read once.

    With ``digests`` each file must be listed there and its bytes must have the listed sha256 (and
    no listed file of these may be missing): the bytes returned are the ones the bundle's manifest
    names, however the files change after this returns or between the bundle's read and this one.
    """
    if not root.is_dir():
        raise EncoderError(f"{root}: missing or not a folder (is it an encoder folder?)")
    present = sorted(
        rel
        for rel in (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        if _builds_the_encoder(rel)
    )
    if digests is not None:
        unlisted = [rel for rel in present if rel not in digests]
        if unlisted:
            raise EncoderError(f"{unlisted[0]}: not listed in the bundle's manifest")
        absent = sorted(rel for rel in digests if _builds_the_encoder(rel) and rel not in present)
        if absent:
            raise EncoderError(f"{absent[0]}: listed in the bundle's manifest but missing")
    files: dict[str, bytes] = {}
    for rel in present:
        data = (root / rel).read_bytes()
        if digests is not None and hashlib.sha256(data).hexdigest() != digests[rel]:
            raise EncoderError(f"{rel}: sha256 mismatch (corrupt, truncated or modified file)")
        files[rel] = data
    return files


def _builds_the_encoder(rel: str) -> bool:
    """The encoder's own files; weights in another format than safetensors are never read."""
    if rel.endswith(_WEIGHT_SUFFIXES) and not rel.endswith(".safetensors"):
        return False
    return rel in (CONFIG_FILE, HEADS_FILE) or rel.startswith(f"{TRANSFORMER_DIR}/")


def _load_transformer(root: Path, files: dict[str, bytes]) -> tuple[Any, Any]:
    """The trunk and its tokenizer from ``transformer/``'s bytes (taken out of ``files``, so a
    file's bytes are freed once their tensors are built): the weights are deserialised from
    memory; config and tokenizer files are written to a private temporary folder (what
    transformers loads them from), removed once read."""
    from safetensors.torch import load as load_safetensors
    from transformers import MODEL_MAPPING, AutoConfig, AutoTokenizer

    prefix = f"{TRANSFORMER_DIR}/"
    own = {rel[len(prefix):]: files.pop(rel) for rel in sorted(files) if rel.startswith(prefix)}
    if "config.json" not in own:
        raise EncoderError(f"{root / TRANSFORMER_DIR / 'config.json'}: missing")
    shards = [_TRUNK_WEIGHTS]
    if _TRUNK_INDEX in own:
        index = parse_json_object(own[_TRUNK_INDEX], f"{prefix}{_TRUNK_INDEX}", EncoderError)
        shards = sorted(set((index.get("weight_map") or {}).values()))
        if not shards:
            raise EncoderError(f"{prefix}{_TRUNK_INDEX}: its weight_map names no file")
    state_dict: dict[str, torch.Tensor] = {}
    for name in shards:
        if name not in own:
            raise EncoderError(f"{prefix}{name}: missing (the trunk's weights, safetensors only)")
        try:
            state_dict.update(load_safetensors(own.pop(name)))
        except Exception as exc:  # safetensors raises its own error types
            raise EncoderError(f"{prefix}{name}: unreadable ({exc})") from exc
    with tempfile.TemporaryDirectory(prefix="esp-encoder-") as tmp:
        for name, data in own.items():
            if not name.endswith(_WEIGHT_SUFFIXES):
                path = Path(tmp, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        config = AutoConfig.from_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    try:
        model_class: Any = MODEL_MAPPING[type(config)]  # what AutoModel picks, with no folder to read
    except KeyError as exc:
        raise EncoderError(f"{prefix}config.json: model type {config.model_type!r} is not supported") from exc
    model = model_class.from_pretrained(None, config=config, state_dict=state_dict)
    return model, tokenizer


class QueryEncoder:
    """Texts -> block-normalised ``(n, D)`` float32 embeddings (and intent probabilities)."""

    def __init__(
        self,
        config: dict[str, Any],
        model: Any,
        tokenizer: Any,
        tensors: dict[str, torch.Tensor],
        device: str,
    ) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        #: float16 autocast for the transformer: on CUDA only (CPU float16 is slow and inexact)
        self.autocast = self.device.type == "cuda"
        try:
            self.layout = SubspaceLayout.from_dict(config["layout"])
        except (LayoutError, KeyError, TypeError) as exc:
            raise EncoderError(f"{CONFIG_FILE}: layout is invalid: {exc}") from exc
        self.max_length = int(config["max_length"])
        self._heads = [
            _Head(h["name"], h.get("kind", "linear"), tensors[f"heads.{h['name']}.weight"],
                  tensors.get(f"heads.{h['name']}.bias"), bool(h.get("normalize_input", False)))
            for h in config["heads"]
        ]
        self._lexical: HashedNgrams | None = None
        if config.get("lexical"):
            try:
                self._lexical = HashedNgrams.from_dict(config["lexical"])
            except (KeyError, TypeError, ValueError) as exc:
                raise EncoderError(f"{CONFIG_FILE}: lexical is invalid: {exc}", field="lexical") from exc
        kinds = {h.kind for h in self._heads}
        if not kinds <= {"linear", "lexical"} or ("lexical" in kinds and self._lexical is None):
            raise EncoderError(f"{CONFIG_FILE}: head kinds {sorted(kinds)} need 'linear' or 'lexical' "
                               "(and a lexical section for 'lexical')")
        self._concat = config.get("normalize", "per_block") == "per_head_then_concat"
        names = [h.name for h in self._heads]
        if self._concat:
            total = sum(h.weight.shape[0] for h in self._heads)
            if len(self.layout) != 1 or self.layout.dim != total:
                raise EncoderError(f"{CONFIG_FILE}: heads of {total} dims do not make the one block "
                                   f"of layout {list(self.layout.names)} ({self.layout.dim} dims)")
        else:
            if names != list(self.layout.names):
                raise EncoderError(
                    f"{CONFIG_FILE}: heads {names} do not match layout {list(self.layout.names)}"
                )
            for hd in self._heads:
                if hd.weight.shape[0] != self.layout[hd.name].dim:
                    raise EncoderError(
                        f"{HEADS_FILE}: heads.{hd.name}.weight has {hd.weight.shape[0]} rows, "
                        f"layout block {hd.name!r} has dim {self.layout[hd.name].dim}"
                    )
        self._adapter = None
        if config.get("adapter"):
            self._adapter = tuple(
                tensors[f"adapter.{k}"] for k in ("down.weight", "down.bias", "up.weight", "up.bias")
            )
        intent = config.get("intent")
        self.intent_classes: list[str] | None = list(intent["classes"]) if intent else None
        self._intent_block: str | None = intent["block"] if intent else None
        self._intent_scale = float(intent["scale"]) if intent else 1.0
        self._prototypes = tensors.get("intent.prototypes") if intent else None
        if intent and self._prototypes is None:
            raise EncoderError(f"{HEADS_FILE}: missing tensor 'intent.prototypes'")

    @classmethod
    def load(
        cls,
        encoder_dir: Path | str,
        *,
        device: str = "cpu",
        threads: int | None = None,
        digests: Mapping[str, str] | None = None,
    ) -> QueryEncoder:
        """Load an ``encoder/`` folder; :class:`EncoderError` names a missing or malformed part.

        ``device``: ``cpu``, ``cuda`` (``cuda:N``) or ``auto`` (:func:`resolve_device`).
        Every file is read once into private memory and every tensor built from those bytes
        (:func:`read_folder`), so nothing served stays mapped from a file: editing or truncating
        the folder afterwards changes nothing (a mapped weight would change rankings silently,
        or fault with SIGBUS). ``digests`` (``path in the folder -> sha256``, the bundle
        manifest's: :attr:`subspace.bundle.Bundle.encoder_digests`): the folder must hold exactly
        these files and the bytes built from must be the listed ones.
        """
        from safetensors.torch import load as load_safetensors

        device = resolve_device(device)
        root = Path(encoder_dir)
        if threads is not None:
            torch.set_num_threads(int(threads))
        files = read_folder(root, digests)
        if CONFIG_FILE not in files:
            raise EncoderError(f"{root / CONFIG_FILE}: missing (is {root} an encoder folder?)")
        config = parse_json_object(files.pop(CONFIG_FILE), CONFIG_FILE, EncoderError)
        if config.get("format") != FORMAT or config.get("format_version") not in READABLE_VERSIONS:
            raise EncoderError(
                f"{CONFIG_FILE}: format {config.get('format')!r} v{config.get('format_version')!r} "
                f"is not supported (this build reads {FORMAT!r} v{list(READABLE_VERSIONS)})"
            )
        for key in ("pooling", "max_length", "heads", "layout"):
            if key not in config:
                raise EncoderError(f"{CONFIG_FILE}: missing field {key!r}")
        if config["pooling"] != "mean":
            raise EncoderError(
                f"{CONFIG_FILE}: pooling {config['pooling']!r} is not supported; allowed: 'mean'"
            )
        if HEADS_FILE not in files:
            raise EncoderError(f"{root / HEADS_FILE}: missing")
        try:
            tensors = load_safetensors(files.pop(HEADS_FILE))
        except Exception as exc:  # safetensors raises its own error types
            raise EncoderError(f"{HEADS_FILE}: unreadable ({exc})") from exc
        model, tokenizer = _load_transformer(root, files)
        model.eval().to(device)
        tensors = {k: v.to(device) for k, v in tensors.items()}
        try:
            encoder = cls(config, model, tokenizer, tensors, device)
        except KeyError as exc:
            raise EncoderError(f"{HEADS_FILE}: missing tensor {exc}") from exc
        log.info("query encoder on %s%s", device, " (float16 autocast)" if encoder.autocast else "")
        return encoder

    @property
    def dim(self) -> int:
        return self.layout.dim

    def _pooled(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        batch = {
            k: v.to(self.device)
            for k, v in enc.items()
            if k in ("input_ids", "attention_mask", "token_type_ids")
        }
        with torch.autocast(device_type=self.device.type, dtype=torch.float16, enabled=self.autocast):
            hidden = self.model(**batch).last_hidden_state
        hidden = hidden.float()
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        x = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        if self._adapter is not None:
            dw, db, uw, ub = self._adapter
            x = x + F.linear(F.gelu(F.linear(x, dw, db)), uw, ub)
        return x

    def _blocks(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        x = self._pooled(texts)
        lex = None
        if self._lexical is not None:
            lex = torch.from_numpy(self._lexical.counts(texts)).to(x.device, x.dtype)
        out = {}
        for hd in self._heads:
            if hd.kind == "lexical" and lex is not None:
                y = lex * hd.weight
            else:
                y = F.linear(F.normalize(x, dim=-1) if hd.normalize_input else x, hd.weight, hd.bias)
            out[hd.name] = F.normalize(y, dim=-1)
        if self._concat:
            (block,) = self.layout.names
            return {block: F.normalize(torch.cat([out[h.name] for h in self._heads], -1), dim=-1)}
        return out

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """``(n, D)`` float32, every block L2-normalised; texts batched by length."""
        texts = list(texts)
        out = np.zeros((len(texts), self.layout.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            blocks = self._blocks([texts[i] for i in idx])
            out[idx] = torch.cat([blocks[n] for n in self.layout.names], -1).float().cpu().numpy()
        return out

    def encode_documents(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Documents as the bundle's corpus was embedded: the document encoder.

        Every format this build reads (versions 1-3) is symmetric: one trunk and one head per
        block for queries and documents alike, no query or document prefix, and the corpus of a
        bundle is embedded with this same network (``esp_retrieval.training.export``; ``esp index`` calls
        this). So this is :meth:`encode`; whoever embeds documents calls this one, so that a
        format with a document side of its own changes here and nowhere else.
        """
        return self.encode(texts, batch_size=batch_size)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as :meth:`encode` sees them (special tokens included, truncated at
        ``max_length``): what an OpenAI-style ``usage`` reports."""
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        return [len(ids) for ids in enc["input_ids"]]

    @torch.inference_mode()
    def intent_probs(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """``(n, C)`` softmax probabilities over :attr:`intent_classes`."""
        if self._prototypes is None or self._intent_block is None or self.intent_classes is None:
            raise EncoderError("this encoder has no intent objective")
        texts = list(texts)
        out = np.zeros((len(texts), len(self.intent_classes)), dtype=np.float32)
        protos = F.normalize(self._prototypes, dim=-1)
        for start in range(0, len(texts), batch_size):
            z = self._blocks(texts[start : start + batch_size])[self._intent_block]
            logits = self._intent_scale * F.normalize(z, dim=-1) @ protos.T
            out[start : start + len(z)] = torch.softmax(logits, -1).float().cpu().numpy()
        return out
