"""Graph surgery with onnx-graphsurgeon: builds the sub-graphs (prefix, suffix) that define segments."""
