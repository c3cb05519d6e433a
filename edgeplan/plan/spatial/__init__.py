"""ADaPS: spatial (height or width) partitioning of CNN layers across heterogeneous devices.

``ops`` (Table 2) and ``intervals`` (which input rows an output interval needs), ``blocks`` (the partitionable
layers of a model, path analysis §4.2), ``cost`` (eqs. (1)–(11)), ``search`` (the ordered tree with alpha-beta
pruning and memoisation, §4.5, and the layer recursion eq. (12)), ``oracle`` (exhaustive and exact searches over
the same space) and ``baselines`` (BBGraP-like and EdgeFlow-like partitions under the same cost model).
"""
