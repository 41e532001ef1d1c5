"""The files of a model folder that every converter (ONNX, CTranslate2, Neuron) copies beside its output:
config, tokenizer, sentence-transformers modules and their weights, so the converted folder serves on its
own (and without torch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from core.errors import require

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot")


def refuse_torch_only(src: Path, head: str | None, converter: str) -> None:
    """Raise ``Unsupported`` before anything is written when the head the folder's task runs (``head``; None: the
    detected task's) has no path but torch (a vision–language embedder): a converted artifact would compute other
    vectors or none."""
    from core.backends.heads import get_head
    from core.errors import Unsupported
    from core.loading import detect_task, read_model_info
    from core.tasks import task_class

    reason = get_head(head or task_class(detect_task(read_model_info(src))).head).torch_only
    if reason:
        raise Unsupported(f"{src} is {reason}; {converter} would give other vectors or none. Serve the folder itself "
                          "with backend 'torch' (what 'auto' picks for it)", code="unsupported_architecture")


def copy_model_files(src: Path, dst: Path) -> None:
    """Copy everything but the encoder's weights (config, tokenizer, sentence-transformers modules, and the
    weights of module folders such as ``2_Dense``, which the task runs itself)."""
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if path.is_dir() or path.suffix in WEIGHT_SUFFIXES or rel.parts[0] in ("onnx", ".git"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    copy_module_weights(src, dst)


def copy_module_weights(src: Path, dst: Path) -> None:
    """The weights of the sentence-transformers module folders ``modules.json`` lists (``1_Dense``,
    ``2_Dense``…) as ``model.safetensors`` (a ``pytorch_model.bin`` is converted), and BGE-M3's
    ``sparse_linear``/``colbert_linear`` heads as ``*.safetensors``: the converted folder serves without torch."""
    for head in ("sparse_linear", "colbert_linear"):  # BGE-M3's extra heads, as safetensors
        if (src / f"{head}.safetensors").exists():
            shutil.copy2(src / f"{head}.safetensors", dst / f"{head}.safetensors")
        elif (src / f"{head}.pt").exists():
            torch = require("torch", "export")
            from safetensors.torch import save_file

            state = torch.load(str(src / f"{head}.pt"), map_location="cpu", weights_only=True)
            save_file({k: v.contiguous() for k, v in state.items()}, str(dst / f"{head}.safetensors"))
    copy_stanford_projection(src, dst)
    modules_file = src / "modules.json"
    if not modules_file.exists():
        return
    for module in json.loads(modules_file.read_text()):
        sub = str(module.get("path", ""))
        if sub in ("", "."):
            continue
        folder, out = src / sub, dst / sub
        if (folder / "model.safetensors").exists():
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / "model.safetensors", out / "model.safetensors")
        elif (folder / "pytorch_model.bin").exists():
            torch = require("torch", "export")
            from safetensors.torch import save_file

            state = torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True)
            out.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))


def copy_stanford_projection(src: Path, dst: Path) -> None:
    """A Stanford ColBERT checkpoint (``HF_ColBERT``) keeps its projection ``linear.weight`` in the encoder's
    weight file, which a converted folder does not carry: it is written to ``linear.safetensors`` beside the
    converted encoder (read by ``core/tasks/late_interaction.py``)."""
    from core.loading import is_stanford_colbert

    if not is_stanford_colbert(src):
        return
    from safetensors.numpy import save_file

    if (src / "model.safetensors").exists():
        from safetensors import safe_open

        with safe_open(str(src / "model.safetensors"), framework="numpy") as f:
            weight = f.get_tensor("linear.weight") if "linear.weight" in f.keys() else None
    elif (src / "pytorch_model.bin").exists():
        torch = require("torch", "export")
        state = torch.load(str(src / "pytorch_model.bin"), map_location="cpu", weights_only=True)
        weight = state["linear.weight"].float().numpy() if "linear.weight" in state else None
    else:
        weight = None
    if weight is not None:
        save_file({"linear.weight": weight.copy()}, str(dst / "linear.safetensors"))
