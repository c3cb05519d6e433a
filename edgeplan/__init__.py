"""edgeplan: a CNN in, verified int8 Edge TPU prefixes and CPU suffixes at every partition point out."""

from edgeplan import quiet as _quiet

__version__ = "0.1.0"

_quiet.install()
