"""The PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`).

torch is imported by `backend` (and the modules it uses) only, so the settings table in
`settings` can be read where torch is not installed (`--backend-config` checks).
"""

import os

# torch's OpenMP threads spin for a while after each parallel region by default, taking
# the cores the event loop and the other models need; here they sleep instead (measured
# with perf/bench_backends.py: server CPU per row of the TorchScript MLP 5.5 -> 3.2 ms on
# two busy cores). OpenMP reads this when torch is first imported; a value set in the
# environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
