"""Is a fast configuration also right? Cosine checks of embeddings against a reference: a server's answers
against stored reference vectors, an in-process engine against given vectors; and the preparation of
the reference (the fp16-stored model folder and sentence-transformers fp32 CPU vectors)."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.inprocess import load_engine
from benchmarks.texts import make_texts

#: the model folder's files the server needs (README, data_config.json etc. stay behind)
MODEL_FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
               "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def parity_texts() -> list[str]:
    return make_texts("short", 32, seed=7) + make_texts("long", 32, seed=7) + make_texts("mixed", 64, seed=7)


def prepare(dst: Path, src: Path | None) -> None:
    """``dst``: the model folder with float16-stored weights (half the size; the fp16 runs cast to fp16
    at load anyway) and ``reference.npz``: sentence-transformers fp32 CPU vectors of the parity texts,
    computed from the original fp32 weights."""
    import numpy as np
    import sentence_transformers
    import torch
    from safetensors.torch import load_file, save_file

    from core.config import default_model_path

    src = src or default_model_path()
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in MODEL_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    if (src / "1_Pooling").is_dir():
        shutil.copytree(src / "1_Pooling", dst / "1_Pooling")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    texts = parity_texts()
    torch.set_num_threads(1)
    model = sentence_transformers.SentenceTransformer(str(src), device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    np.savez_compressed(dst / "reference.npz", texts=np.array(texts), vectors=vectors.astype(np.float32),
                        source=np.array(f"sentence-transformers {sentence_transformers.__version__} fp32 CPU on "
                                        "the original fp32 weights"))
    print(f"wrote {dst} ({sum(f.stat().st_size for f in dst.rglob('*') if f.is_file()) / 2**20:.1f} MiB)")


def load_reference(path: Path | None, model_path: Path, threads: int) -> dict:
    """``reference.npz`` from ``prepare``, else Tessera's torch backend fp32 on CPU on these weights."""
    import numpy as np

    if path is not None and path.exists():
        data = np.load(path)
        return {"texts": [str(t) for t in data["texts"]], "vectors": data["vectors"], "source": str(data["source"])}
    from core.tasks.embed import EmbedRequest

    texts = parity_texts()
    engine = load_engine(model_path, threads, backend="torch", device="cpu", dtype="float32")
    vectors = engine.run_sync(EmbedRequest(texts=texts, normalize=True)).vectors
    return {"texts": texts, "vectors": vectors,
            "source": f"Tessera torch fp32 CPU on the weights in {model_path.name} (no reference.npz)"}


def server_parity(url: str, reference: dict, model: str = "bench") -> dict:
    """Worst and mean cosine of the server's float vectors vs the reference, over the reference's texts."""
    import httpx
    import numpy as np

    texts, ref = reference["texts"], reference["vectors"]
    got = []
    for i in range(0, len(texts), 32):
        r = httpx.post(url + "/v1/embeddings", json={"input": texts[i:i + 32], "model": model,
                                                     "encoding_format": "float"}, timeout=120)
        r.raise_for_status()
        got += [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
    got = np.asarray(got, dtype=np.float64)
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cos = (got * ref).sum(axis=1)
    return {"worst cosine": float(cos.min()), "mean cosine": float(cos.mean()), "texts": len(texts),
            "worst text index": int(cos.argmin()), "reference": reference["source"]}


def engine_worst_cosine(spec: dict, reference, texts: list[str], threads: int) -> float:
    """Worst cosine of an in-process engine's normalized vectors of ``texts`` vs ``reference`` (normalized)."""
    import numpy as np

    from core.tasks.embed import EmbedRequest

    got = load_engine(threads=threads, **spec).run_sync(EmbedRequest(texts=texts, normalize=True)).vectors
    return float(np.min((got * reference).sum(axis=1)))
