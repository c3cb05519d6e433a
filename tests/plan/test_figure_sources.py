"""The label of a predicted latency says which figures enter it: EMULATED only where an Edge TPU prefix runs."""
from edgeplan.plan.swapless.plan import figure_sources


def test_emulated_only_where_a_prefix_runs_on_the_edge_tpu():
    assert figure_sources(0, 9, "emulated") == "CPU"  # all-CPU: no emulated figure enters
    assert figure_sources(4, 9, "emulated") == "Edge TPU EMULATED + CPU"
    assert figure_sources(9, 9, "emulated") == "Edge TPU EMULATED"
    assert figure_sources(4, 9, "measured") == "Edge TPU measured + CPU"


def test_the_label_names_the_emulator_model_version():
    assert figure_sources(4, 9, "emulated:edgeplan-tpu-model-2") == "Edge TPU EMULATED (edgeplan-tpu-model-2) + CPU"
    assert figure_sources(0, 9, "emulated:edgeplan-tpu-model-2") == "CPU"
