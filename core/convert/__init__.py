"""Conversions of a model folder: ONNX export (``onnx_export``, int8 quantization, ``onnx_fp16``, the
offline fusions of ``fusion``, ONNX Runtime's own optimized graph ``ort_optimized``), CTranslate2 (``ct2``), Neuron buckets (``neuron``), and the model files
every converter copies (``files``). ``scripts/`` run them ahead of time; one runs at start-up too: with
``backend: auto`` on a CPU, ``export_cache`` exports a torch-only folder's head with ``onnx_export``
the first time it is served (docs/backends.md, "The export cache"). The backends import nothing of this
package at module level: only the one place that chooses a backend (``core.backends.registry``, and the
precision measurement it runs) reaches the export cache, inside its functions."""
