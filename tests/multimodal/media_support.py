"""The tests' media and loopback server: they live in ``benchmarks.media`` (the media benchmark uses them too)."""

from benchmarks.media import MediaServer, Route, audio_bytes, data_uri, png, sine

__all__ = ["MediaServer", "Route", "audio_bytes", "data_uri", "png", "sine"]
