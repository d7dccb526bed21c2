"""The model code: Llama family, GPT-2, their layers and the paged attention."""
