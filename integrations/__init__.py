"""Integrations of the kernel with other engines (transformers, llama.cpp, vLLM); each folder is self-contained."""
