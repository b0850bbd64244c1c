"""Offline model tools the router and CLI run as subprocesses, never the worker: the GGUF
importer (`python -m models.gguf`) and the provisioner of the models mlxd knows by name
(`python -m models.provision`, catalog in models/catalog.py). Imports only protocol/ and
third-party libraries."""
