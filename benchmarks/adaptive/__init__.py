"""The parts of benchmarks/adaptive_replay.py (benchmarks/results/adaptive_replay*.json).

``sources``: the acceptance tables (synthetic, recorded model-draft and MTP proposals);
``costs``: the step-cost truth per draft shape and the controller's deliberately wrong
prior; ``host_ema``: the host's EMA policy; ``run``: one set replayed under every policy;
``bars``: the bars the controller must meet; ``report``: the JSON report, table and plot.
"""
