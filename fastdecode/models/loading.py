"""`fastdecode.load`: a local Hugging Face folder (or `zoo:NAME`) to a model adapter, safetensors only."""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import logging as hf_logging

from ..errors import DeviceError, ModelLoadError, close_names
from . import mdlm  # noqa: F401  (registers the zoo's diffusion architecture with the Auto classes)
from .canvas_graphs import canvas_graphs_mode
from .causal import CausalLM
from .diffusion import MaskedDiffusionLM
from .exact import exact_mode
from .graphs import graphs_mode
from .guided import ImageLM
from .image import read_image_spec
from .native import check_fused

# model_type -> whether logits are shifted by one (Dream) or at the same position (LLaDA)
DIFFUSION_MODEL_TYPES = {"llada": False, "dream": True, mdlm.MDLMConfig.model_type: None}
UNSAFE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth", "tf_model.h5")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def zoo_names() -> list[str]:
    root = resources.files("fastdecode") / "zoo"
    if not root.is_dir():  # a checkout or install without bundled models
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())


def resolve(source: str | Path) -> Path:
    """Turn `zoo:NAME` or a path into an existing model folder."""
    text = str(source)
    if text.startswith("zoo:"):
        name = text[4:]
        folder = Path(str(resources.files("fastdecode") / "zoo" / name))
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"No zoo model named {name!r}. {close_names(name, zoo_names())}")
        return folder
    folder = Path(text).expanduser()
    if not folder.exists():
        installed = ", ".join(zoo_names()) or "no zoo models installed"
        raise ModelLoadError(f"Model folder {text!r} does not exist. Pass a local Hugging Face folder or zoo:NAME "
                             f"({installed}).")
    if not folder.is_dir():
        raise ModelLoadError(f"{text!r} is a file; pass the folder that holds config.json and model.safetensors.")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{text!r} has no config.json: it is not a Hugging Face model folder.")
    return folder


def check_weights(folder: Path) -> list[Path]:
    """The folder's safetensors files, each checked to open; refuse pickled weights."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{index} is corrupt ({e}); restore it from the original checkpoint.") from None
        files = [folder / s for s in shards]
    else:
        files = [folder / "model.safetensors"]
    for f in files:
        if not f.is_file():
            pickled = [u for u in UNSAFE_WEIGHTS if (folder / u).exists()]
            hint = (
                f" The folder has {pickled[0]}, a pickle format fastdecode does not load because unpickling can run "
                "code; convert it to safetensors where you trust it: in Python, "
                "transformers.AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) (AutoModel for a "
                f"diffusion LM; transformers {transformers.__version__} writes model.safetensors only)."
                if pickled else ""
            )
            raise ModelLoadError(f"Weights file {f} is missing.{hint}")
        try:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    handle.get_slice(key)  # reads the header entry; fails on a truncated file
        except Exception as e:  # safetensors raises several error types for a damaged file
            raise ModelLoadError(f"Weights file {f} is corrupt or truncated ({e}); "
                                 "download or export it again.") from None
    return files


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:  # UnicodeDecodeError included
        raise ModelLoadError(f"{path} is not valid JSON ({e}); restore it from the original checkpoint.") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(cfg).__name__}, not an object of settings; restore it from "
                             "the original checkpoint.")
    return cfg


@contextmanager
def _quiet_transformers() -> Iterator[list[str]]:
    """Keep transformers' progress bars, log lines (its load report) and warnings off the screen while loading.

    The library never prints. The log lines are kept in the list yielded, so that an error can name what
    the report showed (transformers' message then only says "look at the above report").
    """
    lines: list[str] = []
    handler = _Keep(lines)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()
    hf_logging.add_handler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield lines
    finally:
        hf_logging.remove_handler(handler)
        hf_logging.enable_default_handler()
        if bars:
            hf_logging.enable_progress_bar()


class _Keep(logging.Handler):
    """A logging handler that keeps each message's lines, free of terminal colour codes."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()).splitlines()


# a row of transformers' load report: "KEY | MISMATCH | ... ckpt: torch.Size([64]) vs model:torch.Size([32])"
_MISMATCH = re.compile(r"^\s*(.+?)\s*\|\s*MISMATCH\s*\|.*ckpt: torch\.Size\(\[([^\]]*)\]\)"
                       r" vs model:\s*torch\.Size\(\[([^\]]*)\]\)")


def _load_error(e: Exception, folder: Path, kind: str, model_type: str, auto: str, report: list[str]) -> ModelLoadError:
    """transformers' error as one line that says what to do."""
    if "Unrecognized configuration class" in str(e):  # transformers then lists every class it knows
        return ModelLoadError(
            f"Could not load {folder} as a {kind} model: transformers has no {auto} class for its config "
            f"(model_type {model_type!r}). If it is a {'masked-diffusion' if kind == 'causal' else 'causal'} LM, "
            f"pass kind={'diffusion' if kind == 'causal' else 'causal'!r} (CLI: --kind); if its code ships in the "
            "folder, pass trust_remote_code=True (CLI: --trust-remote-code)."
        )
    mismatched = [m for m in map(_MISMATCH.search, report) if m]
    if mismatched:
        key, saved, built = mismatched[0].groups()
        return ModelLoadError(
            f"Could not load {folder}: its weights do not have the shapes config.json gives (e.g. {key} is "
            f"[{saved}] in the weights but [{built}] by config.json); restore config.json from the original checkpoint."
        )
    if isinstance(e, (TypeError, StrictDataclassError)):
        return ModelLoadError(f"Could not load {folder}: config.json is invalid ({' '.join(str(e).split())}); "
                              "restore it from the original checkpoint.")
    return ModelLoadError(f"Could not load {folder}: {' '.join(str(e).split())}")


KINDS = ("causal", "diffusion")
KIND_HINT = "pass kind='causal' or kind='diffusion' (CLI: --kind causal|diffusion)"


def kind_evidence(cfg: dict[str, Any]) -> tuple[str, str] | None:
    """The kind config.json states outright, and where it says so; None when only a guess is possible."""
    model_type = str(cfg.get("model_type", "")).lower()
    architectures = [str(a) for a in cfg.get("architectures") or []]
    causal = [a for a in architectures if a.endswith("ForCausalLM")]
    if model_type in DIFFUSION_MODEL_TYPES:
        return "diffusion", f"model_type {cfg.get('model_type')!r}"
    if causal:
        return "causal", f"architectures {', '.join(causal)}"
    if cfg.get("mask_token_id") is not None:
        return "diffusion", f"mask_token_id {cfg['mask_token_id']} in config.json"
    return None


def detect_kind(cfg: dict[str, Any]) -> str:
    evidence = kind_evidence(cfg)
    if evidence is not None:
        return evidence[0]
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type in CONFIG_MAPPING:
        return "causal"
    raise ModelLoadError(f"Cannot tell whether model_type {model_type!r} is a causal or a masked-diffusion LM; "
                         f"{KIND_HINT}.")


def ships_code(folder: Path, cfg: dict[str, Any]) -> bool:
    """Whether the folder brings its own modelling code (what trust_remote_code would run)."""
    return bool(cfg.get("auto_map")) or any(folder.glob("*.py"))


def pick_device(device: str | torch.device | None) -> torch.device:
    """The device to load on: CUDA when present by default; a name this torch cannot parse, or a device this
    machine or torch build lacks, is refused with what to pass instead."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DeviceError(f"{device!r} is not a device: pass cpu, cuda, cuda:0, cuda:1 ... or mps "
                          "(CLI: --device).") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else f"this torch (CUDA {torch.version.cuda}) sees no GPU")
            raise DeviceError(f"Device {str(device)!r} asked for, but {why}: use --device cpu (Python: device='cpu'), "
                              "or install a CUDA build of torch on a machine with an NVIDIA GPU.")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"Device {str(device)!r} asked for, but this machine has {count} CUDA device(s): "
                              f"pass cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}.")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError(f"Device {str(device)!r} asked for, but MPS (Apple GPUs) is not available here: "
                          "use --device cpu.")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"Device type {dev.type!r} is not supported: pass cpu, cuda, cuda:N or mps (CLI: --device).")
    return dev


def pick_device_dtype(
    device: str | torch.device | None, dtype: str | torch.dtype | None
) -> tuple[torch.device, torch.dtype]:
    dev = pick_device(device)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ModelLoadError(f"Unknown dtype {dtype!r}. {close_names(dtype, DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return dev, dtype


def load(
    source: str | Path,
    *,
    kind: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
    exact: bool | int | None = None,
    graphs: bool | str | None = None,
    fused: bool | None = None,
) -> CausalLM | MaskedDiffusionLM:
    """Load model and tokenizer from a local Hugging Face folder or `zoo:NAME`.

    The kind (causal or diffusion) is detected from config.json; weights must be safetensors. The device
    defaults to CUDA when present, the dtype to bfloat16 on CUDA and float32 on CPU. `trust_remote_code`
    stays off unless asked: checkpoints such as LLaDA and Dream ship their own modelling code and need it.
    `exact` (causal models): every cached forward at one shape, so lossless methods equal their baseline token for
    token in low precision (models/exact.py, docs/gpu.md); None turns it on for CUDA in bfloat16/float16, an int
    sets the block width. `graphs`: CUDA graphs of a causal model's exact-mode forwards (models/graphs.py; None turns
    them on wherever exact mode is on CUDA) or of a diffusion model's whole-canvas forwards (models/canvas_graphs.py;
    None turns them on on CUDA, in any dtype); False off. `fused` (causal models with the direct forward, and the
    zoo's diffusion architecture): the layers' elementwise runs compiled into fused kernels (models/native.py,
    models/mdlm.py); None turns them on with CUDA graphs on CUDA (where Triton is present), True on anywhere
    torch.compile works, False off.
    """
    if kind is not None and kind not in KINDS:
        raise ModelLoadError(f"kind must be 'causal' or 'diffusion', not {kind!r} "
                             "(or leave it out to detect it from config.json).")
    folder = resolve(source)
    cfg = read_config(folder)
    model_type = str(cfg.get("model_type", ""))
    if model_type not in CONFIG_MAPPING:
        if not ships_code(folder, cfg):
            raise ModelLoadError(
                f"{folder} has model_type {model_type!r}, which transformers {transformers.__version__} does not know, "
                "and the folder ships no modelling code (no *.py files, no auto_map in config.json): upgrade "
                "transformers if the architecture is newer, or correct model_type in config.json."
            )
        if not trust_remote_code:
            raise ModelLoadError(
                f"{folder} has model_type {model_type!r}, whose modelling code is not part of transformers but ships "
                "in the folder. Loading it runs that code: pass trust_remote_code=True (CLI: --trust-remote-code) "
                "only if you trust it."
            )
    evidence = kind_evidence(cfg)
    if kind is not None and evidence is not None and evidence[0] != kind:
        raise ModelLoadError(
            f"{folder} holds a {evidence[0]} model ({evidence[1]}), but kind={kind!r} was asked: leave kind out "
            f"(CLI: drop --kind) to load it as the {evidence[0]} model it is, or pass a {kind} model's folder."
        )
    kind = kind or detect_kind(cfg)
    dev, dt = pick_device_dtype(device, dtype)  # a bad device or dtype is refused before the weights are read
    check_fused(fused)
    check_weights(folder)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModel
    with _quiet_transformers() as report:
        try:
            # transformers types from_pretrained as returning the model alone, also with output_loading_info=True
            model, info = auto.from_pretrained(  # type: ignore[misc]
                folder, dtype=dt, use_safetensors=True, trust_remote_code=trust_remote_code, output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, StrictDataclassError) as e:
            raise _load_error(e, folder, kind, model_type, auto.__name__, report) from None
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ModelLoadError(f"{folder} lacks weights for {len(missing)} parameters (e.g. {missing[0]}); "
                             "the checkpoint is incomplete or does not match config.json.")
    model.to(dev)
    tokenizer = _load_tokenizer(folder, trust_remote_code)
    name = str(source)
    if kind == "causal":
        fixed = exact_mode(exact, dev, dt)
        mode = graphs_mode(graphs, dev, fixed)
        image = read_image_spec(folder)  # image.json: a class-conditional image model (models/image.py)
        if image is not None:
            return ImageLM(model, tokenizer, name, exact=fixed, graphs=mode, fused=fused, image=image)
        return CausalLM(model, tokenizer, name, exact=fixed, graphs=mode, fused=fused)
    return MaskedDiffusionLM(model, tokenizer, name, mask_token_id=_mask_token_id(cfg, tokenizer, folder),
                             shifted=_shifted(cfg, model_type), graphs=canvas_graphs_mode(graphs, dev), fused=fused)


def _load_tokenizer(folder: Path, trust_remote_code: bool) -> Any:
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if not any((folder / f).is_file() for f in names):
        return None
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"The tokenizer files in {folder} could not be loaded ({e}).") from None


def _mask_token_id(cfg: dict[str, Any], tokenizer: Any, folder: Path) -> int:
    if isinstance(cfg.get("mask_token_id"), int):
        return cfg["mask_token_id"]
    if tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    raise ModelLoadError(f"{folder} is a masked-diffusion model but neither config.json nor the tokenizer names "
                         "a mask token; add mask_token_id to config.json.")


def _shifted(cfg: dict[str, Any], model_type: str) -> bool:
    if isinstance(cfg.get("logits_shift"), bool):
        return cfg["logits_shift"]
    return bool(DIFFUSION_MODEL_TYPES.get(model_type.lower(), False))
