"""Hugging Face models: safe loading and the pruned BERT variant registered with transformers."""
