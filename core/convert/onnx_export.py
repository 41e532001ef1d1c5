"""Model folder → ONNX folder: ``torch.onnx.export`` of the model head, optional int8 dynamic
quantization, and (opt-in) ONNX Runtime's offline transformer fusions.

The output is a complete model folder (config, tokenizer and sentence-transformers files copied)
with ``onnx/model.onnx`` (fp32) and, with ``int8=True``, ``onnx/model_int8.onnx``; serve it with
``backend: onnx`` (``dtype: int8`` picks the quantized graph).

The fp32 graph is left **plain** by default: with ONNX Runtime 1.32 on CPU the offline fusions
(Attention, EmbedLayerNorm, SkipLayerNorm, BiasGelu) made MiniLM 4–14% *slower* than the plain graph,
on which the session applies its own online fusions (docs/benchmarks.md, "The plain graph is faster
than the offline-fused one on CPU"; measure with scripts/bench_graphs.py).
The fused graph is what the CUDA provider runs best, so ``core/convert/onnx_fp16.py`` fuses before it
converts to fp16; ``optimize=True`` fuses the fp32 graph too.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from core.errors import require

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot")


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


#: bumped whenever the graphs this module writes change (part of the export cache's key)
EXPORTER_VERSION = "1"


def load_head_model(src: Path, head_name: str):
    """The folder's model for a head of ``core/backends/heads.py`` (its transformers class), fp32, eval mode,
    eager attention (the attention the exported graph traces)."""
    from core.backends.heads import get_head

    torch = require("torch", "export")
    transformers = require("transformers", "export")
    auto = getattr(transformers, get_head(head_name).auto_class)
    model = auto.from_pretrained(str(src), dtype=torch.float32, attn_implementation="eager")
    model.eval()  # dropout must not land in the graph
    return model


def export_head(src: Path, out_file: Path, head_name: str, *, opset: int = 17) -> None:
    """Export any head of ``core/backends/heads.py`` (its transformers class and torch call), with the head's
    output names, so the ONNX backend serves it: e.g. ``sequence-classification`` (rerank, classify) →
    ``logits``; ``splade`` → ``sparse_embedding`` (pooled in the graph)."""
    export_model(load_head_model(src, head_name), out_file, head_name, opset=opset)


def export_model(model, out_file: Path, head_name: str, *, opset: int = 17) -> None:
    """``torch.onnx.export`` of a loaded model's head (``load_head_model``) with dynamic batch and sequence axes."""
    import inspect
    import warnings

    from core.backends.heads import get_head

    torch = require("torch", "export")
    head = get_head(head_name)
    accepted = inspect.signature(model.forward).parameters
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]
    sample = {n: torch.ones((2, 8), dtype=torch.long) for n in names}
    if "token_type_ids" in sample:
        sample["token_type_ids"] = torch.zeros((2, 8), dtype=torch.long)
    if "attention_mask" in sample:  # a padded row, so the trace cannot take an all-ones mask's shortcut
        sample["attention_mask"][1, 5:] = 0

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = head.call(self.inner, dict(zip(names, args)))
            return tuple(out[name] for name in head.outputs)

    wrapped = Wrapped(model)
    with torch.inference_mode():
        probe = wrapped(*(sample[n] for n in names))
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    for name, value in zip(head.outputs, probe):  # (batch, labels) or (batch, vocab); (batch, seq, …) per token
        dynamic[name] = {0: "batch", 1: "sequence"} if value.dim() == 3 else {0: "batch"}
    out_file.parent.mkdir(parents=True, exist_ok=True)
    # the tracer's warnings (Python values in shapes, constant folding) are about the trace, not for users
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped,
            tuple(sample[n] for n in names),
            str(out_file),
            input_names=names,
            output_names=list(head.outputs),
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
        )


def head_for_folder(src: Path) -> str:
    """The head the folder's detected task runs (``encoder`` for embedding models)."""
    import importlib

    from core.loading import detect_task, read_model_info
    from core.tasks import TASKS

    module, cls = TASKS[detect_task(read_model_info(src))]
    return getattr(importlib.import_module(module), cls).head


def fused_graph(path: Path, config: dict):
    """The graph at ``path`` with attention/LayerNorm/GELU fused by ONNX Runtime's transformer optimizer
    (an ``onnx.ModelProto``), or None for model types the optimizer does not know."""
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = config.get("model_type", "bert")
    known = {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "bart", "gpt2", "t5"}
    if model_type not in known:
        log.warning("no transformer fusions for model_type %r; keeping the plain graph", model_type)
        return None
    fused = optimize_model(
        str(path),
        model_type="bert" if model_type in ("xlm-roberta", "roberta", "electra", "mpnet") else model_type,
        num_heads=int(config.get("num_attention_heads", 0)),
        hidden_size=int(config.get("hidden_size", 0)),
        opt_level=1,
        use_gpu=False,
    )
    log.info("fusions: %s", fused.get_fused_operator_statistics())
    fused.topological_sort()  # what its save_model_to_file does before writing
    return fused.model


def optimize_transformer(path: Path, config: dict) -> bool:
    """Fuse in place (``fused_graph``). Returns False (graph left as exported) for unknown model types."""
    import onnx

    model = fused_graph(path, config)
    if model is None:
        return False
    onnx.save(model, str(path))
    return True


INT8_MODES = ("fast", "accurate")


def quantize_int8(src_file: Path, dst_file: Path, mode: str = "fast") -> None:
    """Dynamic int8 quantization (int8 weights per output channel, activations quantized per batch).

    ``fast``: every weight MatMul. ``accurate``: the feed-forward MatMuls stay fp32 (their GELU
    activations have outliers that int8 activations clip); slower, closer to fp32.
    Figures for MiniLM (worst/mean cosine vs fp32 over the test sentences) are in docs/backends.md.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if mode not in INT8_MODES:
        raise ValueError(f"int8 mode must be one of {INT8_MODES}")
    exclude: list[str] = []
    if mode == "accurate":
        graph = onnx.load(str(src_file), load_external_data=False).graph
        exclude = [n.name for n in graph.node if n.op_type == "MatMul" and _is_feed_forward(n.name)]
    quantize_dynamic(
        str(src_file), str(dst_file), weight_type=QuantType.QInt8, per_channel=True,
        op_types_to_quantize=["MatMul"], nodes_to_exclude=exclude,
    )


def _is_feed_forward(node_name: str) -> bool:
    """BERT-family naming: ``.../intermediate/dense/MatMul`` and ``.../output/dense/MatMul`` (not attention's)."""
    return "/intermediate/" in node_name or ("/output/dense/" in node_name and "/attention/" not in node_name)


def export_folder(
    src: Path, dst: Path, *, optimize: bool = False, int8: tuple[str, ...] | bool = (), fp16: bool = False,
    opset: int = 17, head: str | None = None,
) -> Path:
    """Write ``dst`` with ``onnx/model.onnx``; ``int8`` names the int8 flavours to add
    (``fast`` → ``onnx/model_int8.onnx``, ``accurate`` → ``onnx/model_int8_accurate.onnx``);
    ``fp16``: also ``onnx/model_fp16.onnx`` (fused, for the CUDA provider); ``optimize``: fuse the fp32
    graph as well (slower on CPU here, see the module doc); ``head``: which model head to export
    (default: the head of the folder's detected task)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    copy_model_files(src, dst)
    onnx_file = dst / "onnx" / "model.onnx"
    head = head or head_for_folder(src)
    export_head(src, onnx_file, head, opset=opset)
    st_config = dst / "config_sentence_transformers.json"
    if head == "causal-lm" and not st_config.exists():  # an LLM reranker stays one, whatever the folder's name
        st_config.write_text(json.dumps({"model_type": "CrossEncoder"}, indent=2) + "\n")
    config = json.loads((src / "config.json").read_text())
    modes = ("fast",) if int8 is True else tuple(int8 or ())
    for mode in modes:  # quantize the plain graph: the quantizer cannot type the fused contrib ops
        suffix = "" if mode == "fast" else f"_{mode}"
        quantize_int8(onnx_file, dst / "onnx" / f"model_int8{suffix}.onnx", mode)
    fused = optimize and optimize_transformer(onnx_file, config)
    if fp16:  # fused first (unless model.onnx already is), then fp16
        from core.convert.onnx_fp16 import convert_fp16

        convert_fp16(onnx_file, dst / "onnx" / "model_fp16.onnx", config=None if fused else config)
    return dst
