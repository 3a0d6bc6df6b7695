"""Integrations of flashattn with other libraries; each is its own module, imported on demand:

- :mod:`flashattn.integrations.transformers`: Hugging Face transformers' AttentionInterface.
"""
