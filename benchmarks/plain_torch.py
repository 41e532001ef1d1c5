"""The hand-written CLIP loop (the runtime's own limit for CLIP, which both servers run with torch on a
CPU): decode the images → the model's processor → ``get_image_features`` / ``get_text_features`` →
L2-normalize, in one process with all cores."""

from __future__ import annotations

from pathlib import Path


def plain_torch_clip(folder: Path, threads: int, dtype: str = "float32"):
    """Returns ``(embed_images, embed_texts)``: image data URIs → vectors, texts → vectors (float32, unit
    norm). ``dtype="int8"``: the torch backend's dynamic int8 quantization (``core.backends.torch``:
    per-channel int8 attention Linears, feed-forward kept fp32), so the loop runs what Tessera runs."""
    import base64
    import io

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoProcessor, CLIPModel

    torch.set_num_threads(threads)
    model = CLIPModel.from_pretrained(str(folder)).eval()
    if dtype == "int8":
        from core.backends.torch import quantize_int8

        model = quantize_int8(torch, model)
    processor = AutoProcessor.from_pretrained(str(folder))
    max_length = model.config.text_config.max_position_embeddings

    def unit(features) -> np.ndarray:
        vectors = (features if hasattr(features, "shape") else features.pooler_output).float().numpy()
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def embed_images(uris: list[str]) -> np.ndarray:
        images = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in uris]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            return unit(model.get_image_features(pixel_values=pixels))

    def embed_texts(texts: list[str]) -> np.ndarray:
        enc = processor.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.inference_mode():
            return unit(model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]))

    return embed_images, embed_texts
