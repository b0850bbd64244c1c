"""The router's children and their keepers: the worker pool (lifecycle, with the model
names and the memory budget it delegates to), each worker's supervisor and the kvstore's,
the child process and its ZMQ client, and the waits of requests for a model to load."""
