"""Model folder → ONNX folder: ``torch.onnx.export`` of the model head, optional int8 dynamic
quantization, and (opt-in) ONNX Runtime's offline transformer fusions.

The output is a complete model folder (config, tokenizer and sentence-transformers files copied)
with ``onnx/model.onnx`` (fp32) and, with ``int8=True``, ``onnx/model_int8.onnx``; serve it with
``backend: onnx`` (``dtype: int8`` picks the quantized graph).

The fp32 graph is left **plain** by default: on the CPU the offline fusions (Attention, EmbedLayerNorm,
SkipLayerNorm, BiasGelu) run slower than the plain graph, on which the session applies its own online
fusions (measured in docs/bench/history.md; measure again with scripts/bench_graphs.py).
The fused graph (``core/convert/fusion.py``) is what the CUDA provider runs best, so
``core/convert/onnx_fp16.py`` fuses before it converts to fp16; ``optimize=True`` fuses the fp32 graph too.
The config, tokenizer and module files are copied as for every converter (``core/convert/files.py``).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from core.backends.heads import accepted_inputs, get_head, is_feed_forward, load_head_class
from core.convert.files import copy_model_files, refuse_torch_only
from core.convert.fusion import optimize_transformer
from core.errors import Unsupported, require
from core.loading import custom_code, task_adapters

log = logging.getLogger(__name__)

#: bumped whenever the graphs this module writes change (part of the export cache's key)
#: (2: encoder-only classes of encoder–decoder configs, bidirectional Gemma 3 masks, custom code refused)
EXPORTER_VERSION = "2"


def load_head_model(src: Path, head_name: str, *, trust_remote_code: bool = False):
    """The folder's model for a head of ``core/backends/heads.py`` (its transformers class), fp32, eval mode,
    eager attention (the attention the exported graph traces). A model with its own code (config ``auto_map``)
    is loaded with that code when ``trust_remote_code`` is set and refused otherwise: transformers' built-in
    class of its ``model_type`` would compute something else (see ``refuse_custom_code``)."""
    torch = require("torch", "export")
    config = model_config(src)
    code = custom_code(config)
    if code is not None and not trust_remote_code:
        raise refuse_custom_code(src, config, code)
    if code is None:
        check_known_model_type(src, config)
    auto = load_head_class(src, head_name, "export")
    # the model's own code chooses its attention (it may not take transformers' implementations)
    kwargs = {"trust_remote_code": True} if code else {"attn_implementation": "eager"}
    try:
        model = auto.from_pretrained(str(src), dtype=torch.float32, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        if code is None:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Unsupported(f"{src}: the model's own code ({code}) could not be loaded: {first}. Place the code it "
                          "names in the folder (or fetch it from the Hub with the model), or serve the model with "
                          "backend torch and trust_remote_code: true where its code can be loaded",
                          code="custom_code") from exc
    model.eval()  # dropout must not land in the graph
    return model


def model_config(src: Path) -> dict:
    config_file = Path(src) / "config.json"
    return json.loads(config_file.read_text()) if config_file.exists() else {}


def refuse_custom_code(src: Path, config: dict, code: str) -> Unsupported:
    """The refusal for a model with its own code that the converter was not told to run: converting it with
    transformers' built-in class of its ``model_type`` gives a different model (jina-embeddings-v3's task
    adapters dropped), or fails (NomicBert: no such class)."""
    model_type = config.get("model_type")
    return Unsupported(
        f"{src}: config.json names the model's own code ({code}); converting it with transformers' built-in "
        f"{model_type!r} class would drop what that code does and give different vectors. Pass "
        "--trust-remote-code to convert it with its own code (the result is checked against that code), or "
        "serve the folder with backend torch and trust_remote_code: true", code="custom_code")


def check_known_model_type(src: Path, config: dict) -> None:
    """``Unsupported`` (not transformers' ValueError) for a ``model_type`` transformers has no class for."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type and model_type not in CONFIG_MAPPING_NAMES:
        import transformers

        raise Unsupported(f"{src}: transformers {transformers.__version__} has no model_type {model_type!r} and "
                          "config.json names no code of the model's own (auto_map); the converter cannot load it. "
                          "Serve it with a backend that can (torch, with the model's code and "
                          "trust_remote_code: true), or upgrade transformers", code="unsupported_architecture")


def export_head(src: Path, out_file: Path, head_name: str, *, opset: int = 17, trust_remote_code: bool = False) -> None:
    """Export any head of ``core/backends/heads.py`` (its transformers class and torch call), with the head's
    output names, so the ONNX backend serves it: e.g. ``sequence-classification`` (rerank, classify) →
    ``logits``; ``splade`` → ``sparse_embedding`` (pooled in the graph)."""
    model = load_head_model(src, head_name, trust_remote_code=trust_remote_code)
    export_model(model, out_file, head_name, opset=opset)


def export_model(model, out_file: Path, head_name: str, *, opset: int = 17) -> None:
    """``torch.onnx.export`` of a loaded model's head (``load_head_model``) with dynamic batch and sequence axes."""
    import warnings

    torch = require("torch", "export")
    head = get_head(head_name)
    accepted = accepted_inputs(model)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]
    sample = {n: torch.ones((2, 8), dtype=torch.long) for n in names}
    if "token_type_ids" in sample:
        sample["token_type_ids"] = torch.zeros((2, 8), dtype=torch.long)
    if "attention_mask" in sample:  # a padded row, so the trace cannot take an all-ones mask's shortcut
        sample["attention_mask"][1, 5:] = 0
    if task_adapters(model.config.to_dict()) and "adapter_mask" in accepted:
        # task adapters (jina-embeddings-v3): the graph takes the task's index, as the model's published graph
        # does, and the model's code gets it per row (adapter_mask)
        names.append("task_id")
        sample["task_id"] = torch.tensor(1, dtype=torch.long)

    masks = traceable_masks(model)

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            feeds = dict(zip(names, args))
            if "task_id" in feeds:
                feeds["adapter_mask"] = feeds.pop("task_id").expand(feeds["input_ids"].shape[0])
            if masks is not None:
                feeds["attention_mask"] = masks(feeds["attention_mask"])
            out = head.call(self.inner, feeds)
            return tuple(out[name] for name in head.outputs)

    wrapped = Wrapped(model)
    with torch.inference_mode():
        probe = wrapped(*(sample[n] for n in names))
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names if n != "task_id"}
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


#: model types whose bidirectional attention masks the exporter builds itself (``traceable_masks``)
BIDIRECTIONAL_MASKS = frozenset({"gemma3_text"})


def traceable_masks(model):
    """For a model with bidirectional attention over sliding and full layers (EmbeddingGemma:
    ``Gemma3TextModel``, ``use_bidirectional_attention``): a function from the (batch, seq) padding mask to
    the per-layer-type additive masks the model's forward takes in place of it (a dict by layer type), built
    from plain tensor operations. transformers builds the same masks with mask functions that the TorchScript
    exporter cannot trace (``RuntimeError: unordered_map::at``). As transformers' ``_bidirectional_window_overlay``:
    a full layer sees every real token; a sliding layer those less than ``sliding_window`` positions away.
    None for any other model (its own mask code is traced)."""
    config = getattr(model, "config", None)
    if (getattr(config, "model_type", None) not in BIDIRECTIONAL_MASKS
            or not getattr(config, "use_bidirectional_attention", False)):
        return None
    import torch

    window = int(config.sliding_window)
    kinds = set(config.layer_types)

    def masks(attention_mask):
        blocked = torch.finfo(torch.float32).min
        keys = attention_mask[:, None, None, :].to(torch.bool)  # (batch, 1, 1, key)
        full = torch.zeros(keys.shape, dtype=torch.float32).masked_fill(~keys, blocked)
        pos = torch.arange(attention_mask.shape[1])
        near = (pos[:, None] - pos[None, :]).abs() < window  # (query, key)
        out = {"full_attention": full.expand(-1, -1, attention_mask.shape[1], -1)}
        if "sliding_attention" in kinds:
            out["sliding_attention"] = full.masked_fill(~near[None, None], blocked)
        return out

    return masks


def head_for_folder(src: Path) -> str:
    """The head the folder's detected task runs (``encoder`` for embedding models): ``detect_task`` of
    ``core/loading.py`` and the task's class, as ``Engine.load`` finds them."""
    from core.loading import detect_task, read_model_info
    from core.tasks import task_class

    return task_class(detect_task(read_model_info(src))).head


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
        exclude = [n.name for n in graph.node if n.op_type == "MatMul" and is_feed_forward(n.name)]
    quantize_dynamic(
        str(src_file), str(dst_file), weight_type=QuantType.QInt8, per_channel=True,
        op_types_to_quantize=["MatMul"], nodes_to_exclude=exclude,
    )


@contextmanager
def _stage(what: str, out_file: Path):
    """One log line per stage: what it wrote, its size and how long it took."""
    started = time.monotonic()
    yield
    size = out_file.stat().st_size / 1e6 if out_file.exists() else 0.0
    log.info("%s: %s (%.1f MB) in %.1fs", what, out_file.name, size, time.monotonic() - started)


def export_folder(
    src: Path, dst: Path, *, optimize: bool = False, int8: tuple[str, ...] | bool = (), fp16: bool = False,
    opset: int = 17, head: str | None = None, trust_remote_code: bool = False,
) -> Path:
    """Write ``dst`` with ``onnx/model.onnx``; ``int8`` names the int8 flavours to add
    (``fast`` → ``onnx/model_int8.onnx``, ``accurate`` → ``onnx/model_int8_accurate.onnx``);
    ``fp16``: also ``onnx/model_fp16.onnx`` (fused, for the CUDA provider); ``optimize``: fuse the fp32
    graph as well (slower on CPU here, see the module doc); ``head``: which model head to export
    (default: the head of the folder's detected task); ``trust_remote_code``: a model with its own code
    (config ``auto_map``) is exported with that code (refused without it, before anything is written)."""
    src, dst = Path(src), Path(dst)
    config = model_config(src)
    if custom_code(config) is not None and not trust_remote_code:
        raise refuse_custom_code(src, config, custom_code(config))
    head = head or head_for_folder(src)
    refuse_torch_only(src, head, "an ONNX export")
    dst.mkdir(parents=True, exist_ok=True)
    copy_model_files(src, dst)
    onnx_file = dst / "onnx" / "model.onnx"
    with _stage(f"export ({head} head, fp32)", onnx_file):
        export_head(src, onnx_file, head, opset=opset, trust_remote_code=trust_remote_code)
    st_config = dst / "config_sentence_transformers.json"
    if head == "causal-lm" and not st_config.exists():  # an LLM reranker stays one, whatever the folder's name
        st_config.write_text(json.dumps({"model_type": "CrossEncoder"}, indent=2) + "\n")
    config = json.loads((src / "config.json").read_text())
    modes = ("fast",) if int8 is True else tuple(int8 or ())
    for mode in modes:  # quantize the plain graph: the quantizer cannot type the fused contrib ops
        suffix = "" if mode == "fast" else f"_{mode}"
        out_file = dst / "onnx" / f"model_int8{suffix}.onnx"
        with _stage(f"int8 {mode}", out_file):
            quantize_int8(onnx_file, out_file, mode)
    with _stage("fusions (fp32)", onnx_file) if optimize else nullcontext():
        fused = optimize and optimize_transformer(onnx_file, config)
    if fp16:  # fused first (unless model.onnx already is), then fp16
        from core.convert.onnx_fp16 import convert_fp16

        with _stage("fp16", dst / "onnx" / "model_fp16.onnx"):
            convert_fp16(onnx_file, dst / "onnx" / "model_fp16.onnx", config=None if fused else config)
    return dst
