"""From files to a model: checkpoints (safetensors, GGUF), model configs, tokenizers, chat
templates, `load_model`."""
