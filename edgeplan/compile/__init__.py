"""Edge TPU compilation: the real ``edgetpu_compiler`` when it is on PATH, else an emulated compiler that
applies the documented Edge TPU rules. Both write the same ``compile.json`` (``CompileReport``)."""
