"""The SSD cold tier of the prefix KV cache: one process shared by every worker.

Stores opaque bytes by (namespace, 16-byte block key); never imports MLX.
"""
