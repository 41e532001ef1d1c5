"""Retrieval quality: exact scoring (metrics.py) and the built-in set of real (query, document) pairs (data.py)."""
