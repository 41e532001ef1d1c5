"""Bulk work: a corpus embedded in one command (``python -m core embed``), here or on a cluster (Ray, Modal);
docs/bulk.md."""
