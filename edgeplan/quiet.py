"""TensorFlow's load-time lines, kept off the terminal.

TensorFlow's native runtime writes to file descriptor 2 while it loads, whatever ``TF_CPP_MIN_LOG_LEVEL`` says:
"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR" and "Could not find cuda
drivers on your machine, GPU will not be used", twice per process, so four lines at the start of every command
that converts a model (and four more from each child that does). ``install`` makes the process's first
``import tensorflow`` run with descriptor 2 pointed at a temporary file: the lines are dropped when the import
succeeds and written out when it fails. ``EDGEPLAN_NATIVE_LOGS=1`` (set by ``edgeplan -v``) leaves them on.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "EDGEPLAN_NATIVE_LOGS"


@contextmanager
def native_stderr_held() -> Iterator[None]:
    """Descriptor 2 goes to a temporary file for the duration; its content is written out on an exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the first import of the process is the one that loads the runtime
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or os.environ.get(ENV) == "1":
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            with native_stderr_held():
                run(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Hold TensorFlow's load-time lines (module docstring) in this process, unless it is already loaded."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
