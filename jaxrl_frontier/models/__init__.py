"""Models: the decoder (layers.py, transformer.py), Hugging Face checkpoints in and out (architectures.py, hf.py), tokenizers, LoRA adapters, and text to ids and back."""
