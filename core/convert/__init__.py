"""Offline conversions of a model folder (ONNX export, quantization). Used by scripts/, never at serve time."""
