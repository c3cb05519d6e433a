"""Multi-device execution: MPI ranks of a split (numpy, ai-edge-litert, mpi4py: the ``mpi`` extra)."""
