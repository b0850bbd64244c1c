"""Wire protocol shared by the router, workers and the kvstore: messages, codec, sockets."""
