"""Conversions of a model folder: ONNX export (``onnx_export``, int8 quantization, ``onnx_fp16``, the
offline fusions of ``fusion``, ONNX Runtime's own optimized graph ``ort_optimized``), CTranslate2 (``ct2``), Neuron buckets (``neuron``), and the model files
every converter copies (``files``). ``scripts/`` run them ahead of time; one runs at start-up too: with
``backend: auto`` on a CPU, ``core.export_cache`` exports a torch-only folder's head with ``onnx_export``
the first time it is served (docs/backends.md, "The export cache")."""
