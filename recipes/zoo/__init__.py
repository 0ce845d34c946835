"""Deterministic example model builders for the tests, the benchmarks and the recipes' scripts:
`onnx_models` (ONNX, with onnx.helper) and `tflite_models` (TFLite flatbuffers). Not installed with aotc."""
