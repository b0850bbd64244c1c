"""The router process: HTTP API in front, one supervised worker process per model behind."""
