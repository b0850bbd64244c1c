"""Offline model tools the router and CLI run as subprocesses, never the worker: the GGUF
importer (`python -m models.gguf`) and the default-model provisioner (`python -m
models.provision`). Imports only protocol/ and third-party libraries."""
