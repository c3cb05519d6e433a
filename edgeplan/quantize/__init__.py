"""ONNX -> int8 TFLite once per model, and cutting the int8 model at a partition point."""
