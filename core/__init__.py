"""Tessera core: model loading, dynamic batching, inference backends and the OpenAI-compatible API."""
