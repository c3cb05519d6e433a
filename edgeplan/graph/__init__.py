"""Load, canonicalise and measure ONNX graphs. Nothing here writes a file (STYLE.md)."""
