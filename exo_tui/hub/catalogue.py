"""The catalogue of well-known models (catalogue.toml): entries, and their cards for placement."""
# pyright: strict

from __future__ import annotations

import functools
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, ValidationError, model_validator

from engine.types import Frozen, ModelCard, Quantization, QuantizationMode
from exo_tui.hub.cache import repo_folder
from exo_tui.hub.errors import HubError

ToolFormat = Literal["json_tools", "qwen3_coder", "mistral", "harmony", "llama3_json", "none"]


class CatalogueError(HubError):
    pass


class CatalogueEntry(Frozen):
    """One model of the catalogue: its hub repo and the figures of its config.json."""

    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    family: str
    model_type: str
    parameters: int = Field(gt=0)
    # A mixture of experts': what one token's pass reads (see catalogue.toml's header).
    active_parameters: int | None = Field(default=None, gt=0)
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    experts: int = Field(default=0, ge=0)
    active_experts: int = Field(default=0, ge=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    bytes: int = Field(gt=0)
    bits: int = Field(gt=0, le=16)
    group_size: int = Field(gt=0)
    quantization_mode: QuantizationMode = "affine"
    # Where the experts are quantized otherwise than the rest (gpt-oss: MXFP4 experts, 8-bit
    # rest): the bits and group of every other linear, the embeddings and the head (affine).
    rest_bits: int | None = Field(default=None, gt=0, le=16)
    rest_group_size: int | None = Field(default=None, gt=0)
    context_length: int = Field(gt=0)
    reasoning: bool
    tool_format: ToolFormat
    tensor: bool

    @model_validator(mode="after")
    def _shapes_agree(self) -> Self:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not a multiple of heads ({self.heads}); "
                "give head_dim"
            )
        if (self.experts == 0) != (self.active_experts == 0) or self.active_experts > self.experts:
            raise ValueError("experts and active_experts must both be set, active <= experts")
        if self.experts == 0 and self.active_parameters is not None:
            raise ValueError("active_parameters is for a mixture of experts (experts > 0)")
        if self.active_parameters is not None and self.active_parameters > self.parameters:
            raise ValueError("active_parameters is more than parameters")
        if (self.rest_bits is None) != (self.rest_group_size is None):
            raise ValueError("rest_bits and rest_group_size go together")
        return self

    @property
    def name(self) -> str:
        return self.repo

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.heads

    @property
    def quantization(self) -> Quantization:
        """The model's quantization (of its experts, where the rest differs)."""
        return Quantization(bits=self.bits, group_size=self.group_size, mode=self.quantization_mode)

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per quantized weight, the per-group scale (and bias) included."""
        return self.quantization.bits_per_weight

    @property
    def rest_bits_per_weight(self) -> float:
        """Stored bits per weight outside the experts: the embeddings, head and attention."""
        if self.rest_bits is None or self.rest_group_size is None:
            return self.bits_per_weight
        return Quantization(bits=self.rest_bits, group_size=self.rest_group_size).bits_per_weight

    @property
    def bytes_outside_layers(self) -> int:
        """Embeddings (and an untied head) at their stored bits, and the final norm (16-bit)."""
        matrices = 1 if self.tied_embeddings else 2
        embeddings = matrices * self.vocab_size * self.hidden_size * self.rest_bits_per_weight / 8
        return int(embeddings) + 2 * self.hidden_size


class _CatalogueFile(Frozen):
    model: tuple[CatalogueEntry, ...]


USER_CATALOGUE_ENV = "EXO_TUI_CATALOGUE"


def _default_text() -> str:
    return resources.files("exo_tui.hub").joinpath("catalogue.toml").read_text(encoding="utf-8")


def parse_catalogue(text: str, origin: str = "catalogue.toml") -> tuple[CatalogueEntry, ...]:
    """Entries of a catalogue file; CatalogueError names the entry and field that are wrong."""
    try:
        data = tomllib.loads(text)
        entries = _CatalogueFile.model_validate(data).model
    except tomllib.TOMLDecodeError as error:
        raise CatalogueError(f"{origin} is not valid TOML ({error})", "Fix the file") from error
    except ValidationError as error:
        raise CatalogueError(f"{origin} has a bad entry: {error}", "Fix the entry") from error
    repos = [entry.repo for entry in entries]
    duplicates = sorted({repo for repo in repos if repos.count(repo) > 1})
    if duplicates:
        raise CatalogueError(
            f"{origin} lists {', '.join(duplicates)} more than once", "Keep one entry per repo"
        )
    return entries


def load_catalogue(path: Path | None = None) -> tuple[CatalogueEntry, ...]:
    """The catalogue at `path`; by default the one shipped in the package, after the user's
    own entries from the file named by EXO_TUI_CATALOGUE (the same format), if set."""
    if path is not None:
        return _read(str(path))
    return _with_user_entries(os.environ.get(USER_CATALOGUE_ENV) or None)


@functools.cache
def _with_user_entries(user_file: str | None) -> tuple[CatalogueEntry, ...]:
    packaged = parse_catalogue(_default_text())
    if user_file is None:
        return packaged
    try:
        own = _read(user_file)
    except OSError as error:
        raise CatalogueError(
            f"Cannot read {user_file}, named by {USER_CATALOGUE_ENV} ({error.strerror or error})",
            f"Fix the path, or unset {USER_CATALOGUE_ENV}",
        ) from error
    mine = {entry.repo.lower() for entry in own}
    return (*own, *(entry for entry in packaged if entry.repo.lower() not in mine))


@functools.cache
def _read(path: str) -> tuple[CatalogueEntry, ...]:
    return parse_catalogue(Path(path).read_text(encoding="utf-8"), path)


def find_entry(repo: str) -> CatalogueEntry | None:
    """The catalogue entry of a repo id (any case), or None."""
    wanted = repo.lower()
    return next((e for e in load_catalogue() if e.repo.lower() == wanted), None)


def entry_card(entry: CatalogueEntry) -> ModelCard:
    """The card placement reads, from the catalogue's figures alone (nothing on disk).

    Its source is `hf_cache` and its path the repo's cache folder: where a download puts it.
    """
    reason = None if entry.tensor else f"mlx-lm's {entry.model_type} model has no shard()"
    return ModelCard(
        name=entry.repo,
        path=str(repo_folder(entry.repo)),
        source="hf_cache",
        model_type=entry.model_type,
        num_layers=entry.layers,
        hidden_size=entry.hidden_size,
        num_attention_heads=entry.heads,
        num_kv_heads=entry.kv_heads,
        head_dim=entry.attention_head_dim,
        vocab_size=entry.vocab_size,
        context_length=entry.context_length,
        quantization=entry.quantization,
        dtype="bfloat16",
        bytes_on_disk=entry.bytes,
        num_parameters=entry.parameters,
        supports_tensor=entry.tensor,
        tensor_unsupported_reason=reason,
        bytes_in_layers=max(0, entry.bytes - entry.bytes_outside_layers),
    )
