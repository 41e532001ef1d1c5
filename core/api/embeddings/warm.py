"""The warm requests of the embeddings feature: a text answered as float lists and as base64, and once per
media modality the model embeds, a tiny image (PNG) or sound (WAV) as a data: URI, so the first real request
finds the encoders and the image and audio decoders ready."""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib
from typing import Any

from core.api.common import WARM_TEXT


def _data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _png(width: int = 8, height: int = 8) -> bytes:
    """A grey RGB PNG (the format's minimum: signature, IHDR, one IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * (3 * width) for _ in range(height))  # filter byte 0, then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _wav_silence(seconds: float = 0.25, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(2 * int(seconds * rate)))
    return buffer.getvalue()


def warm_bodies(name: str, modalities: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [
        (f"embeddings {encoding}", {"model": name, "input": WARM_TEXT, "encoding_format": encoding})
        for encoding in ("float", "base64")
    ]
    media = {"image": _data_uri("image/png", _png()), "audio": _data_uri("audio/wav", _wav_silence())}
    for modality in modalities:
        if modality in media:
            out.append((f"embeddings {modality}", {"model": name, "input": [media[modality]], "modality": modality}))
    return out
