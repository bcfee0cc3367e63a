"""The PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`).

torch is imported by `backend` (and the modules it uses) only, so the settings table in
`settings` can be read where torch is not installed (`--backend-config` checks).
"""
