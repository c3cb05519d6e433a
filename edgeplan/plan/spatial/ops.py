"""ADaPS Table 2: how an operator partitions along height or width.

Type 1 ops have a window (kernel, stride, padding, dilation): an output row needs a band of input rows, so
neighbouring partitions depend on each other's rows. Type 2 ops are row for row (element-wise, per-pixel
channel mixing): an output row needs the same input row. Type 3 ops mix rows or drop the spatial layout
(flatten, reshape, global pooling, concatenation, fully-connected): the partitioned region ends before them.
One table per graph format; an op in neither is refused by the caller, never guessed.
"""
from __future__ import annotations

TYPE1, TYPE2, TYPE3 = 1, 2, 3

ONNX_TYPES: dict[str, int] = {
    **dict.fromkeys(("Conv", "MaxPool", "AveragePool"), TYPE1),
    **dict.fromkeys(("Mul", "Add", "Sub", "Div", "HardSwish", "HardSigmoid", "BatchNormalization", "Relu",
                     "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "Identity", "QuantizeLinear",
                     "DequantizeLinear"), TYPE2),
    **dict.fromkeys(("Concat", "Reshape", "ReduceMean", "Flatten", "Dropout", "Gemm", "MatMul",
                     "GlobalAveragePool", "GlobalMaxPool", "Softmax", "Transpose", "Squeeze", "LRN"), TYPE3),
}

TFLITE_TYPES: dict[str, int] = {
    **dict.fromkeys(("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D"), TYPE1),
    **dict.fromkeys(("ADD", "MUL", "SUB", "HARD_SWISH", "RELU", "RELU6", "LOGISTIC", "TANH", "QUANTIZE",
                     "DEQUANTIZE", "LEAKY_RELU", "PRELU"), TYPE2),
    **dict.fromkeys(("CONCATENATION", "RESHAPE", "MEAN", "FULLY_CONNECTED", "SOFTMAX", "TRANSPOSE", "SQUEEZE",
                     "PAD"), TYPE3),
}


def onnx_type(op_type: str) -> int | None:
    """Table 2 type of an ONNX op, or None when the table does not know it."""
    return ONNX_TYPES.get(op_type)


def tflite_type(op_name: str) -> int | None:
    """Table 2 type of a TFLite builtin op (by its BuiltinOperator name), or None."""
    return TFLITE_TYPES.get(op_name)
