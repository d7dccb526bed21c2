"""Execution backends: how the engine's steps run (`backend.py` says what each one owns).

`choose.build_backend` picks one when the engine is built; model files see only `LayerOps`
(`layer_ops.py`) and the step's `ModelInputs` (`metadata.py`).
"""
